/**
 * rate-limiter-flexible's API on the module: RateLimiterValkey is
 * RateLimiterRedis (same options, methods and RateLimiterRes), RateLimiterUnion
 * is atomic (one RL.ALL), RateLimiterQueue waits in the server (BLOCK).
 * Differences are listed in the package README ("rate-limiter-flexible").
 */
import { RateLimitClient, type ValkeyLike } from './client.js';
import { isUnavailable } from './errors.js';
import type { CallOptions, Window } from './limiters.js';
import { parseResult, type RateLimitResult } from './result.js';

/** rate-limiter-flexible's result: resolved when allowed, the rejection when not. */
export class RateLimiterRes {
  remainingPoints: number;
  msBeforeNext: number;
  consumedPoints: number;
  isFirstInDuration: boolean;
  constructor(remainingPoints = 0, msBeforeNext = 0, consumedPoints = 0, isFirstInDuration = false) {
    this.remainingPoints = remainingPoints;
    this.msBeforeNext = msBeforeNext;
    this.consumedPoints = consumedPoints;
    this.isFirstInDuration = isFirstInDuration;
  }
  toJSON(): Record<string, unknown> {
    return { remainingPoints: this.remainingPoints, msBeforeNext: this.msBeforeNext, consumedPoints: this.consumedPoints, isFirstInDuration: this.isFirstInDuration };
  }
  toString(): string {
    return JSON.stringify(this.toJSON());
  }
}

/** What an insurance limiter must offer (any rate-limiter-flexible limiter, e.g. RateLimiterMemory). */
interface Insurance {
  consume(key: string, points?: number): Promise<unknown>;
  penalty(key: string, points?: number): Promise<unknown>;
  reward(key: string, points?: number): Promise<unknown>;
  block(key: string, secDuration: number): Promise<unknown>;
  get(key: string): Promise<unknown>;
  set(key: string, points: number, secDuration: number): Promise<unknown>;
  delete(key: string): Promise<unknown>;
}

export interface RateLimiterValkeyOptions {
  /** An iovalkey/ioredis client (standalone or Cluster), or a RateLimitClient. */
  storeClient: ValkeyLike | RateLimitClient;
  /** Points per duration (default 4). */
  points?: number;
  /** The window in seconds (default 1; 0: 3650 days, the module's longest). */
  duration?: number;
  /** Seconds a key is blocked once it asks for more than `points` (default 0: not blocked). */
  blockDuration?: number;
  /** Default `'rlflx'`; the key is `${keyPrefix}:${key}`. */
  keyPrefix?: string;
  /** Put the key in a hash tag (`${keyPrefix}:{${key}}`) so that a RateLimiterUnion works in Cluster. */
  hashTag?: boolean;
  /** `false` (default): a fixed window aligned to the clock; `true`: a sliding window counter. */
  sliding?: boolean;
  /** Used when the store is unavailable (rate-limiter-flexible's option of this name). */
  insuranceLimiter?: Insurance;
  /** Timeout per call in ms when `storeClient` is a connection (default 500). */
  timeoutMs?: number;
  /** rate-limiter-flexible options with no equivalent here are refused, not ignored. */
  execEvenly?: boolean;
  inMemoryBlockOnConsumed?: number;
  inMemoryBlockDuration?: number;
}

const MAX_SECONDS = 3650 * 86_400;
const seconds = (s: number): string => `${s === 0 ? MAX_SECONDS : s}s`;

export class RateLimiterValkey {
  readonly client: RateLimitClient;
  readonly points: number;
  readonly duration: number;
  readonly blockDuration: number;
  readonly keyPrefix: string;
  readonly execEvenly = false;
  private readonly hashTag: boolean;
  private readonly sliding: boolean;
  private readonly insurance: Insurance | undefined;

  constructor(options: RateLimiterValkeyOptions) {
    if (!options?.storeClient) throw new TypeError('RateLimiterValkey needs { storeClient }: an iovalkey or ioredis client');
    for (const name of ['execEvenly', 'inMemoryBlockOnConsumed', 'inMemoryBlockDuration'] as const) {
      if (options[name]) throw new TypeError(`RateLimiterValkey does not support ${name} (see the package README)`);
    }
    this.client = options.storeClient instanceof RateLimitClient
      ? options.storeClient
      : new RateLimitClient(options.storeClient, { timeoutMs: options.timeoutMs ?? 500 });
    this.points = options.points ?? 4;
    this.duration = options.duration ?? 1;
    this.blockDuration = options.blockDuration ?? 0;
    this.keyPrefix = options.keyPrefix ?? 'rlflx';
    this.hashTag = options.hashTag ?? false;
    this.sliding = options.sliding ?? false;
    this.insurance = options.insuranceLimiter;
    for (const [name, v] of [['points', this.points], ['duration', this.duration], ['blockDuration', this.blockDuration]] as const) {
      if (!Number.isInteger(v) || v < 0) throw new RangeError(`${name} must be a whole number >= 0, not ${v}`);
    }
  }

  getKey(key: string | number): string {
    const k = this.hashTag ? `{${key}}` : String(key);
    return this.keyPrefix ? `${this.keyPrefix}:${k}` : k;
  }

  /** @internal The limiter as RL.ALL's definition. */
  get definition(): Window {
    return { algorithm: 'window', limit: Math.max(this.points, 1), period: seconds(this.duration), sliding: this.sliding };
  }

  /** @internal A decision as rate-limiter-flexible reports it. */
  toRes(r: RateLimitResult, cost: number): RateLimiterRes {
    const used = r.limit - r.remaining;
    if (r.allowed) return new RateLimiterRes(r.remaining, r.resetAfterMs, used, used === cost && cost > 0);
    // Denied: nothing was taken; report what rate-limiter-flexible would have counted.
    return new RateLimiterRes(0, r.retryAfterMs >= 0 ? r.retryAfterMs : r.resetAfterMs, used + cost, false);
  }

  private window(key: string | number, options: CallOptions): Promise<RateLimitResult> {
    return this.client.check(this.getKey(key), this.definition, options);
  }

  private async insured<T>(method: keyof Insurance, args: unknown[], run: () => Promise<T>): Promise<T> {
    try {
      return await run();
    } catch (err) {
      if (!this.insurance || !isUnavailable(err)) throw err;
      return (this.insurance[method] as (...a: unknown[]) => Promise<T>)(...args);
    }
  }

  /** Takes `pointsToConsume`; resolves a RateLimiterRes, rejects with one when denied (with an Error when the store fails). */
  consume(key: string | number, pointsToConsume = 1, options: { customDuration?: number } = {}): Promise<RateLimiterRes> {
    if (options.customDuration !== undefined) return Promise.reject(new TypeError('RateLimiterValkey does not support customDuration (the window is the limiter\'s)'));
    return this.insured('consume', [key, pointsToConsume], async () => {
      if (this.points === 0) throw new RateLimiterRes(0, this.duration * 1000, pointsToConsume, false);
      const r = await this.window(key, {
        cost: pointsToConsume,
        ...(this.blockDuration > 0 ? { lockout: seconds(this.blockDuration) } : {}),
      });
      if (r.allowed) return this.toRes(r, pointsToConsume);
      if (r.retryAfterMs < 0) {
        // More than `points` at once: never allowed, and the module does not
        // lock on a request that can never pass; rate-limiter-flexible blocks.
        if (this.blockDuration > 0) {
          const b = await this.block(key, this.blockDuration);
          throw new RateLimiterRes(0, b.msBeforeNext, r.limit - r.remaining + pointsToConsume, false);
        }
        throw new RateLimiterRes(0, r.resetAfterMs || this.duration * 1000, r.limit - r.remaining + pointsToConsume, false);
      }
      throw this.toRes(r, pointsToConsume);
    });
  }

  /** Adds points without a decision (as much as fits: the module never counts past the limit). */
  penalty(key: string | number, points = 1): Promise<RateLimiterRes> {
    return this.insured('penalty', [key, points], async () => {
      const r = await this.window(key, { cost: points, partial: true });
      return new RateLimiterRes(r.remaining, r.resetAfterMs, r.limit - r.remaining, false);
    });
  }

  /** Gives points back (RL.REFUND): never below zero consumed. */
  reward(key: string | number, points = 1): Promise<RateLimiterRes> {
    return this.insured('reward', [key, points], async () => {
      const r = await this.client.refund(this.getKey(key), points);
      return r === null ? new RateLimiterRes(this.points, 0, 0, false) : new RateLimiterRes(r.remaining, r.resetAfterMs, r.limit - r.remaining, false);
    });
  }

  /** Blocks the key for `secDuration` seconds (0: 3650 days) as a LOCKOUT, in one transaction. */
  block(key: string | number, secDuration: number): Promise<RateLimiterRes> {
    return this.insured('block', [key, secDuration], async () => {
      const k = this.getKey(key);
      const [lock] = await this.transaction([
        ['RL.UNLOCK', k],
        windowCall(k, this.definition, ['COST', this.definition.limit, 'PARTIAL']),
        windowCall(k, this.definition, ['LOCKOUT', seconds(secDuration)]),
      ], [2]);
      const r = parseResult(lock, 'RL.WINDOW', 'none', 1);
      return new RateLimiterRes(0, r.retryAfterMs, this.points + 1, false);
    });
  }

  /** The key's state, or null when it has none (a full limiter). */
  get(key: string | number): Promise<RateLimiterRes | null> {
    return this.insured('get', [key], async () => {
      const r = await this.client.peek(this.getKey(key));
      return r === null ? null : new RateLimiterRes(r.remaining, r.resetAfterMs, r.limit - r.remaining, false);
    });
  }

  /**
   * Sets the consumed points (in one transaction): up to `points` in the
   * current window; above it, the key is blocked for `secDuration` (0: 3650 days).
   */
  set(key: string | number, points: number, secDuration = this.duration): Promise<RateLimiterRes> {
    return this.insured('set', [key, points, secDuration], async () => {
      const k = this.getKey(key);
      const take = Math.min(points, this.definition.limit);
      const commands: (string | number)[][] = [['DEL', k]];
      if (take > 0) commands.push(windowCall(k, this.definition, ['COST', take]));
      if (points > this.points) commands.push(windowCall(k, this.definition, ['LOCKOUT', seconds(secDuration)]));
      const replies = await this.transaction(commands, commands.map((_, i) => i).slice(1));
      const last = replies[replies.length - 1];
      if (last === undefined) return new RateLimiterRes(this.points, 0, 0, false);
      const r = parseResult(last, 'RL.WINDOW', 'none', 1);
      return new RateLimiterRes(r.remaining, r.allowed ? r.resetAfterMs : r.retryAfterMs, points, false);
    });
  }

  /** Deletes the key: true when there was one. */
  delete(key: string | number): Promise<boolean> {
    return this.insured('delete', [key], () => this.client.reset(this.getKey(key)));
  }

  /** Runs commands in MULTI/EXEC (one key: fine in Cluster); returns the replies at `keep`. */
  private async transaction(commands: (string | number)[][], keep: number[]): Promise<unknown[]> {
    const replies = await this.client.transaction(commands);
    return keep.map((i) => replies[i]);
  }
}

function windowCall(key: string, w: Window, options: (string | number)[]): (string | number)[] {
  return ['RL.WINDOW', key, w.limit, w.period as string, ...(w.sliding ? ['SLIDING'] : []), ...options];
}

/**
 * Several limiters, all or nothing, in one RL.ALL: a request denied by one
 * takes from none (rate-limiter-flexible's RateLimiterUnion consumes from
 * each limiter separately). Resolves `{ [keyPrefix]: RateLimiterRes }`;
 * rejects with the same for the limiters that denied it.
 */
export class RateLimiterUnion {
  private readonly limiters: RateLimiterValkey[];
  constructor(...limiters: RateLimiterValkey[]) {
    if (limiters.length < 1) throw new Error('RateLimiterUnion: at least one limiter have to be passed');
    for (const l of limiters) {
      if (!(l instanceof RateLimiterValkey)) throw new TypeError('RateLimiterUnion: every limiter must be a RateLimiterValkey');
      if (l.client.connection !== limiters[0]!.client.connection) throw new TypeError('RateLimiterUnion: every limiter must use the same storeClient (one atomic call)');
    }
    const blocks = new Set(limiters.map((l) => l.blockDuration).filter((b) => b > 0));
    if (blocks.size > 1) throw new TypeError('RateLimiterUnion: the limiters\' blockDuration must be equal (RL.ALL takes one LOCKOUT)');
    const prefixes = new Set(limiters.map((l) => l.keyPrefix));
    if (prefixes.size !== limiters.length) throw new TypeError('RateLimiterUnion: every limiter needs its own keyPrefix');
    this.limiters = limiters;
  }

  async consume(key: string | number, points = 1): Promise<Record<string, RateLimiterRes>> {
    const first = this.limiters[0]!;
    const block = Math.max(...this.limiters.map((l) => l.blockDuration));
    const result = await first.client.all(
      this.limiters.map((l) => ({ key: l.getKey(key), limiter: l.definition, name: l.keyPrefix })),
      { cost: points, ...(block > 0 ? { lockout: seconds(block) } : {}) },
    );
    const out: Record<string, RateLimiterRes> = {};
    this.limiters.forEach((l, i) => {
      const r = result.limiters[i]!;
      if (result.allowed || !r.allowed) out[l.keyPrefix] = l.toRes(r, points);
    });
    if (!result.allowed) throw out;
    return out;
  }
}

/** rate-limiter-flexible's queue error (queue full, more tokens than the limiter has, or the wait timed out). */
export class RateLimiterQueueError extends Error {
  override name = 'RateLimiterQueueError';
  extra: string | undefined;
  constructor(message: string, extra?: string) {
    super(message);
    this.extra = extra;
  }
}

export interface RateLimiterQueueOptions {
  /** Waiters per key in this process beyond which removeTokens rejects at once (default 4294967295). */
  maxQueueSize?: number;
  /** Give up after this many ms (default 0: wait as long as it takes, as rate-limiter-flexible does). */
  maxWaitMs?: number;
  /**
   * The connection the waits use (a waiting call holds its connection).
   * Default: a duplicate of the limiter's (standalone clients), closed by `close()`.
   */
  connection?: ValkeyLike;
}

/**
 * A FIFO queue of requests for tokens, kept by the server (BLOCK): no polling,
 * first come first served across every process that waits on the key.
 */
export class RateLimiterQueue {
  private readonly limiter: RateLimiterValkey;
  private readonly maxQueueSize: number;
  private readonly maxWaitMs: number;
  private readonly client: RateLimitClient;
  private readonly owned: (ValkeyLike & { quit?: () => Promise<unknown> }) | undefined;
  private readonly waiting = new Map<string, number>();

  constructor(limiter: RateLimiterValkey, options: RateLimiterQueueOptions = {}) {
    this.limiter = limiter;
    this.maxQueueSize = options.maxQueueSize ?? 4294967295;
    this.maxWaitMs = options.maxWaitMs ?? 0;
    let conn = options.connection;
    const main = limiter.client.connection as ValkeyLike & { duplicate?: (o?: object) => ValkeyLike; nodes?: unknown };
    if (!conn && typeof main.duplicate === 'function' && typeof main.nodes !== 'function') {
      conn = main.duplicate({ commandTimeout: undefined, enableOfflineQueue: true });
      this.owned = conn;
    }
    this.client = new RateLimitClient(limiter.client.connection, { timeoutMs: limiter.client.timeoutMs, blockingConnection: conn ?? main });
  }

  /** Points left now (a peek). */
  async getTokensRemaining(key = 'limiter'): Promise<number> {
    const r = await this.client.peek(this.limiter.getKey(key));
    return r === null ? this.limiter.points : r.remaining;
  }

  /** Waits until `tokens` can be taken, takes them and resolves what remains. */
  async removeTokens(tokens: number, key = 'limiter'): Promise<number> {
    if (tokens > this.limiter.points) throw new RateLimiterQueueError(`Requested tokens ${tokens} exceeds maximum ${this.limiter.points} tokens per interval`);
    const queued = this.waiting.get(key) ?? 0;
    if (queued >= this.maxQueueSize) throw new RateLimiterQueueError('Number of requests reached it\'s maximum', `${key}`);
    this.waiting.set(key, queued + 1);
    try {
      const r = await this.client.check(this.limiter.getKey(key), this.limiter.definition, { cost: tokens, block: this.maxWaitMs });
      if (!r.allowed) throw new RateLimiterQueueError(`no tokens within ${this.maxWaitMs} ms`, `${key}`);
      return r.remaining;
    } finally {
      const n = (this.waiting.get(key) ?? 1) - 1;
      if (n <= 0) this.waiting.delete(key); else this.waiting.set(key, n);
    }
  }

  /** Closes the connection this queue opened (if it did). */
  async close(): Promise<void> {
    await this.owned?.quit?.();
  }
}
