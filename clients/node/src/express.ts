/**
 * ValkeyStore: an express-rate-limit (v7, v8) store. One module command per
 * request (RL.WINDOW by default), no Lua, nothing to load after a restart.
 * The mapping and where it differs from express-rate-limit's own stores are
 * in the package README ("express-rate-limit").
 */
import { RateLimitClient, type ValkeyLike } from './client.js';
import type { Limiter } from './limiters.js';
import type { RateLimitResult } from './result.js';

/** express-rate-limit's `ClientRateLimitInfo` (and `IncrementResponse`). */
export interface ClientRateLimitInfo { totalHits: number; resetTime: Date | undefined }

/** What the store reads of express-rate-limit's options in `init`. */
interface MiddlewareOptions { windowMs: number; limit?: unknown; skipFailedRequests?: boolean }

export interface ValkeyStoreOptions {
  /** An iovalkey/ioredis client (standalone or Cluster), or a RateLimitClient. */
  client: ValkeyLike | RateLimitClient;
  /** Key prefix (default `'rl:erl:'`): the key is prefix + express-rate-limit's key. */
  prefix?: string;
  /**
   * `'fixed'` (default): RL.WINDOW, windows aligned to the clock;
   * `'sliding'`: RL.WINDOW SLIDING; `'log'`: RL.SLIDINGLOG (exact).
   */
  algorithm?: 'fixed' | 'sliding' | 'log';
  /** Timeout per call in ms when `client` is a connection (default 500); a timeout fails the request as any store error. */
  timeoutMs?: number;
}

/** The limit of counting mode: the module counts, express-rate-limit decides. */
const COUNT_ONLY = 1_000_000_000_000_000;

export class ValkeyStore {
  /** express-rate-limit: keys are shared between instances (it uses this to detect double counting). */
  readonly localKeys = false;
  readonly prefix: string;
  readonly client: RateLimitClient;
  readonly algorithm: 'fixed' | 'sliding' | 'log';
  private windowMs = 60_000;
  private limit = COUNT_ONLY;
  private counting = true;
  private trackDenied = false;
  /** Denied hits not yet decremented: express-rate-limit's skipFailedRequests decrements a 429 too, which took nothing here. */
  private readonly denied = new Map<string, { count: number; until: number }>();

  constructor(options: ValkeyStoreOptions) {
    if (!options?.client) throw new TypeError('ValkeyStore needs { client }: an iovalkey or ioredis client');
    this.client = options.client instanceof RateLimitClient
      ? options.client
      : new RateLimitClient(options.client, { timeoutMs: options.timeoutMs ?? 500 });
    this.prefix = options.prefix ?? 'rl:erl:';
    this.algorithm = options.algorithm ?? 'fixed';
    if (!['fixed', 'sliding', 'log'].includes(this.algorithm)) throw new TypeError(`algorithm must be 'fixed', 'sliding' or 'log', not ${JSON.stringify(this.algorithm)}`);
  }

  /**
   * Reads `windowMs` and `limit`. A numeric limit is decided by the module
   * (denied hits take nothing); a limit function (per request) switches to
   * counting: every hit is counted and the middleware compares.
   */
  init(options: MiddlewareOptions): void {
    if (!Number.isInteger(options.windowMs) || options.windowMs < 1) throw new RangeError(`ValkeyStore: windowMs must be a whole number of ms >= 1, not ${options.windowMs}`);
    this.windowMs = options.windowMs;
    this.counting = typeof options.limit !== 'number';
    if (this.counting && this.algorithm === 'log') throw new TypeError("ValkeyStore: a limit function needs algorithm 'fixed' or 'sliding' (a log of every hit would be unbounded)");
    this.limit = this.counting ? COUNT_ONLY : (options.limit as number);
    this.trackDenied = !this.counting && options.skipFailedRequests === true;
  }

  private limiter(): Limiter {
    return this.algorithm === 'log'
      ? { algorithm: 'slidinglog', limit: this.limit, period: this.windowMs }
      : { algorithm: 'window', limit: this.limit, period: this.windowMs, sliding: this.algorithm === 'sliding' };
  }

  private info(r: RateLimitResult): ClientRateLimitInfo {
    const totalHits = this.counting ? COUNT_ONLY - r.remaining : r.allowed ? r.limit - r.remaining : r.limit + 1;
    // Denied: when the same request would pass (express-rate-limit's Retry-After reads resetTime).
    const ms = !r.allowed && r.retryAfterMs >= 0 ? r.retryAfterMs : r.resetAfterMs;
    return { totalHits, resetTime: new Date(Date.now() + ms) };
  }

  async increment(key: string): Promise<ClientRateLimitInfo> {
    const r = await this.client.check(this.prefix + key, this.limiter());
    const info = this.info(r);
    if (r.failedOpen) info.totalHits = 1; // a RateLimitClient that fails open: this hit, let through
    if (!r.allowed && this.trackDenied) {
      const entry = this.denied.get(key);
      this.denied.set(key, { count: (entry?.count ?? 0) + 1, until: info.resetTime!.getTime() });
      if (this.denied.size > 10_000) this.pruneDenied();
    }
    return info;
  }

  /** RL.REFUND 1, unless this key has a denied hit pending (which took nothing). */
  async decrement(key: string): Promise<void> {
    const entry = this.denied.get(key);
    if (entry) {
      if (--entry.count <= 0) this.denied.delete(key);
      if (entry.until > Date.now()) return;
    }
    await this.client.refund(this.prefix + key, 1);
  }

  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    const r = await this.client.peek(this.prefix + key);
    return r === null ? undefined : this.info(r);
  }

  async resetKey(key: string): Promise<void> {
    this.denied.delete(key);
    await this.client.reset(this.prefix + key);
  }

  /** Deletes every key under the prefix (SCAN + UNLINK; on each primary of a Cluster). */
  async resetAll(): Promise<void> {
    this.denied.clear();
    const conn = this.client.connection as ValkeyLike & { nodes?: (role: string) => ValkeyLike[] };
    const nodes = typeof conn.nodes === 'function' ? conn.nodes('master') : [conn];
    const pattern = `${this.prefix.replace(/[*?[\]\\]/g, '\\$&')}*`;
    for (const node of nodes) {
      let cursor = '0';
      do {
        const [next, keys] = (await node.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)) as [string, string[]];
        cursor = String(next);
        for (const k of keys) await node.call('UNLINK', k); // one key per call: keys of a cluster node span slots
      } while (cursor !== '0');
    }
  }

  private pruneDenied(): void {
    const now = Date.now();
    for (const [k, v] of this.denied) if (v.until <= now) this.denied.delete(k);
  }
}
