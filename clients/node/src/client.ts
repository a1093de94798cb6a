/**
 * RateLimitClient: one typed method per module command, over an iovalkey or
 * ioredis connection (standalone `Redis` or `Cluster`), with a timeout on
 * every call and a failure policy (README: "Keys, clients and failure").
 */
import { DenyCache } from './denyCache.js';
import { fromClientError, isUnavailable, RateLimitError, RateLimitReplyError, RateLimitTimeoutError } from './errors.js';
import {
  type CallOptions, type Duration, type Limiter, type PolicyRef,
  durationArg, durationMs, limitSize, limiterArgs, optionArgs, parseLimiter, windowOf,
} from './limiters.js';
import { AllResult, type Extra, parseAll, parseResult, RateLimitResult } from './result.js';

type Arg = string | number | Buffer;

/** What the client needs of a connection: iovalkey's and ioredis's `Redis` and `Cluster` all have it. */
export interface ValkeyLike {
  call(command: string, ...args: Arg[]): Promise<unknown>;
  multi?(): { call(command: string, ...args: Arg[]): unknown; exec(): Promise<[Error | null, unknown][] | null> };
}

export interface ClientOptions {
  /**
   * Every call is answered, or fails with RateLimitTimeoutError, within this
   * many ms (default 500). A call that waits (BLOCK) gets its wait on top.
   */
  timeoutMs?: number;
  /**
   * When the limiter is unavailable (no connection, a timeout, a LOADING or
   * CLUSTERDOWN reply), `'closed'` (default) rejects with the error, `'open'`
   * resolves as allowed, with `failedOpen: true` and no headers. Errors that
   * say the call is wrong (bad arguments, WRONGTYPE, NOPERM) always reject.
   */
  failMode?: 'open' | 'closed';
  /** Called with every error that was failed open (for logging and metrics). */
  onError?: (err: RateLimitError) => void;
  /**
   * The connection for calls with `block` (a waiting call holds its
   * connection, and commands sent behind it wait too). Default: the main
   * connection. Give it no `commandTimeout` (this client times calls itself).
   */
  blockingConnection?: ValkeyLike;
  /**
   * Answers `check` (and `tokenBucket`, `window`, `slidingLog`, `gcra`)
   * locally while the server's last denial of the same request lasts
   * (off unless given; see DenyCache).
   */
  denyCache?: DenyCache;
}

/**
 * Connection options for iovalkey/ioredis that suit a limiter (a limiter must
 * never be the slow part of a request): `new Valkey({ host, port, ...recommendedOptions(50) })`.
 * - connect and command timeouts of `timeoutMs`;
 * - `maxRetriesPerRequest: 0`, `enableOfflineQueue: false`: while disconnected a
 *   call fails at once instead of waiting in a queue and being sent, stale, later;
 * - `autoResendUnfulfilledCommands: false`: a call that timed out is not sent
 *   again after a reconnect (it would be charged twice);
 * - `enableReadyCheck: false`: no INFO round trip before the connection is used.
 */
export function recommendedOptions(timeoutMs = 500): Record<string, unknown> {
  return {
    connectTimeout: timeoutMs,
    commandTimeout: timeoutMs,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    autoResendUnfulfilledCommands: false,
    enableReadyCheck: false,
    retryStrategy: (times: number) => Math.min(times * 100, 1000),
  };
}

/** One of RL.ALL's limiters: its key, its limiter, and a name for the headers. */
export interface AllEntry { key: string; limiter: Limiter | PolicyRef; name?: string }

/** redis-cell's reply to CL.THROTTLE, as it is (seconds, `limited`). */
export interface CellResult { limited: boolean; limit: number; remaining: number; retryAfterSeconds: number; resetAfterSeconds: number }

export class RateLimitClient {
  readonly connection: ValkeyLike;
  readonly timeoutMs: number;
  readonly failMode: 'open' | 'closed';
  private readonly onError: ((err: RateLimitError) => void) | undefined;
  private readonly blocking: ValkeyLike;
  readonly denyCache: DenyCache | undefined;

  constructor(connection: ValkeyLike, options: ClientOptions = {}) {
    if (typeof connection?.call !== 'function') throw new TypeError('RateLimitClient needs an iovalkey or ioredis client (Redis or Cluster)');
    this.connection = connection;
    this.timeoutMs = options.timeoutMs ?? 500;
    this.failMode = options.failMode ?? 'closed';
    if (this.failMode !== 'open' && this.failMode !== 'closed') throw new TypeError(`failMode must be 'open' or 'closed', not ${JSON.stringify(this.failMode)}`);
    this.onError = options.onError;
    this.blocking = options.blockingConnection ?? connection;
    this.denyCache = options.denyCache;
  }

  // ---- the algorithms ----

  /** RL.TOKENBUCKET key capacity refill_amount refill_period [options] */
  tokenBucket(key: string, capacity: number, refillAmount: number, refillPeriod: Duration, options: CallOptions = {}): Promise<RateLimitResult> {
    return this.check(key, { algorithm: 'tokenbucket', capacity, refillAmount, refillPeriod }, options);
  }

  /** RL.WINDOW key limit period [SLIDING] [options]: a fixed (clock-aligned) or sliding window. */
  window(key: string, limit: number, period: Duration, options: CallOptions & { sliding?: boolean } = {}): Promise<RateLimitResult> {
    return this.check(key, { algorithm: 'window', limit, period, sliding: options.sliding ?? false }, options);
  }

  /** RL.SLIDINGLOG key limit period [COUNTDENIED] [options]: an exact sliding log. */
  slidingLog(key: string, limit: number, period: Duration, options: CallOptions & { countDenied?: boolean } = {}): Promise<RateLimitResult> {
    return this.check(key, { algorithm: 'slidinglog', limit, period, countDenied: options.countDenied ?? false }, options);
  }

  /** RL.GCRA key burst rate period [options] */
  gcra(key: string, burst: number, rate: number, period: Duration, options: CallOptions = {}): Promise<RateLimitResult> {
    return this.check(key, { algorithm: 'gcra', burst, rate, period }, options);
  }

  /**
   * Any limiter, by definition: `check(key, { algorithm: 'window', limit: 100, period: '1m' })`.
   * With a deny cache, a request it still knows denied is answered locally (`local: true`).
   */
  check(key: string, limiter: Limiter, options: CallOptions = {}): Promise<RateLimitResult> {
    const [command, ...params] = limiterArgs(limiter);
    const name = `RL.${command as string}`;
    const args = [key, ...params, ...optionArgs(options)];
    const cache = this.denyCache;
    const query = cache && DenyCache.query(key, limiter, options);
    if (cache === undefined || query === undefined) return this.decide(name, args, options, limitSize(limiter), windowOf(limiter));
    const local = cache.check(query);
    if (local !== undefined) return Promise.resolve(local);
    const sent = cache.sending();
    return this.decide(name, args, options, limitSize(limiter), windowOf(limiter)).then((result) => {
      cache.record(query, sent, result);
      return result;
    });
  }

  /** RL.LIMIT key policy [options]: a stored policy applied to a key. */
  limit(key: string, policy: string, options: CallOptions = {}): Promise<RateLimitResult> {
    return this.decide('RL.LIMIT', [key, policy, ...optionArgs(options)], options, 0, undefined);
  }

  /** RL.THROTTLE key max_burst count_per_period period [quantity]: redis-cell's arguments, the standard reply (limit = max_burst + 1). */
  throttle(key: string, maxBurst: number, countPerPeriod: number, period: Duration, quantity = 1): Promise<RateLimitResult> {
    return this.decide('RL.THROTTLE', [key, maxBurst, countPerPeriod, durationArg(period), quantity], { cost: quantity },
      maxBurst + 1, undefined);
  }

  /** CL.THROTTLE, redis-cell's own command and reply (for code that speaks redis-cell). */
  async clThrottle(key: string, maxBurst: number, countPerPeriod: number, period: Duration, quantity = 1): Promise<CellResult> {
    const r = await this.send('CL.THROTTLE', [key, maxBurst, countPerPeriod, durationArg(period), quantity]);
    if (!Array.isArray(r) || r.length !== 5) throw new RateLimitReplyError(`unexpected CL.THROTTLE reply: ${JSON.stringify(r)}`);
    const [limited, limit, remaining, retry, reset] = r.map(Number) as [number, number, number, number, number];
    return { limited: limited === 1, limit, remaining, retryAfterSeconds: retry, resetAfterSeconds: reset };
  }

  /** RL.ALL: one request against several limiters, all or nothing. In Cluster the keys must share a slot (see `sameSlot`). */
  async all(entries: AllEntry[], options: Omit<CallOptions, 'block'> = {}): Promise<AllResult> {
    if (entries.length === 0) throw new TypeError('RL.ALL needs at least one limiter');
    const args: (string | number)[] = [entries.length, ...entries.map((e) => e.key)];
    for (const e of entries) args.push(...limiterArgs(e.limiter));
    args.push(...optionArgs(options));
    const names = entries.map((e, i) => e.name ?? `l${i}`);
    const windows = entries.map((e) => windowOf(e.limiter));
    try {
      const reply = await this.send('RL.ALL', args);
      return parseAll(reply, options.partial ?? false, options.cost ?? 1, names, windows);
    } catch (err) {
      const limits = entries.map((e) => limitOf(e.limiter));
      return this.failOpen(err, () => new AllResult(true, 0, options.cost ?? 1,
        limits.map((l, i) => openResult(l, windows[i])), names, true));
    }
  }

  /** RL.PEEK key: the limiter's state under its stored parameters; null when there is none (a full limiter). */
  async peek(key: string): Promise<RateLimitResult | null> {
    const reply = await this.send('RL.PEEK', [key]);
    return reply === null ? null : parseResult(reply, 'RL.PEEK', 'none', undefined);
  }

  /** RL.REFUND key amount: give units back; null when the key holds no limiter. `refunded` says how much came back. */
  async refund(key: string, amount = 1): Promise<RateLimitResult | null> {
    this.denyCache?.forget(key);
    const reply = await this.send('RL.REFUND', [key, amount]);
    return reply === null ? null : parseResult(reply, 'RL.REFUND', 'refunded', undefined);
  }

  /** RL.UNLOCK key: lift a LOCKOUT now; false when there was none. */
  async unlock(key: string): Promise<boolean> {
    this.denyCache?.forget(key);
    return Number(await this.send('RL.UNLOCK', [key])) === 1;
  }

  // ---- leases ----

  /** RL.LEASE key limit ttl [COST n] [DRYRUN] [BLOCK timeout]: `leaseId` is set when granted. */
  lease(key: string, limit: number, ttl: Duration, options: Pick<CallOptions, 'cost' | 'dryRun' | 'block'> = {}): Promise<RateLimitResult> {
    return this.decide('RL.LEASE', [key, limit, durationArg(ttl), ...optionArgs(options)], options, limit, durationMs(ttl), 'lease');
  }

  /** RL.RELEASE key lease_id: false when the lease was not held (released already, or expired). */
  async release(key: string, leaseId: string): Promise<boolean> {
    return Number(await this.send('RL.RELEASE', [key, leaseId])) === 1;
  }

  /** RL.EXTEND key lease_id ttl: false when the lease is no longer held (stop the work, or acquire again). */
  async extend(key: string, leaseId: string, ttl: Duration): Promise<boolean> {
    return Number(await this.send('RL.EXTEND', [key, leaseId, durationArg(ttl)])) === 1;
  }

  /**
   * Runs `work` holding a lease, released in `finally` (also when `work`
   * throws). Throws LeaseDeniedError when no slot was granted (after waiting
   * up to `options.block`). Failing open, `work` runs without a lease.
   */
  async withLease<T>(key: string, limit: number, ttl: Duration, work: (lease: RateLimitResult) => Promise<T> | T,
    options: Pick<CallOptions, 'cost' | 'block'> = {}): Promise<T> {
    const lease = await this.lease(key, limit, ttl, options);
    if (!lease.allowed) throw new LeaseDeniedError(key, lease);
    try {
      return await work(lease);
    } finally {
      if (lease.leaseId) await this.release(key, lease.leaseId).catch(() => false); // the TTL frees it otherwise
    }
  }

  // ---- stored policies ----

  /** RL.POLICY.SET name limiter */
  async policySet(name: string, limiter: Limiter): Promise<void> {
    await this.send('RL.POLICY.SET', [name, ...limiterArgs(limiter)]);
  }

  /** RL.POLICY.GET name: the definition, or null. */
  async policyGet(name: string): Promise<Limiter | null> {
    const reply = await this.send('RL.POLICY.GET', [name]);
    return reply === null ? null : parseLimiter((reply as unknown[]).map(String));
  }

  /** RL.POLICY.DEL name [name ...]: how many existed. */
  async policyDel(...names: string[]): Promise<number> {
    return Number(await this.send('RL.POLICY.DEL', names));
  }

  /** RL.POLICY.LIST: the names defined on this node. */
  async policyList(): Promise<string[]> {
    return ((await this.send('RL.POLICY.LIST', [])) as unknown[]).map(String);
  }

  /** DEL key: forget a limiter (it is full again). True when there was one. */
  async reset(key: string): Promise<boolean> {
    this.denyCache?.forget(key);
    return Number(await this.send('DEL', [key])) === 1;
  }

  // ---- plumbing ----

  /**
   * Commands in one MULTI/EXEC (in Cluster, all on keys of one slot): their
   * replies, or the first error as a typed one, within timeoutMs.
   */
  async transaction(commands: Arg[][]): Promise<unknown[]> {
    const conn = this.connection;
    if (typeof conn.multi !== 'function') throw new TypeError('the connection has no multi(): use an iovalkey or ioredis client');
    const multi = conn.multi();
    for (const [command, ...args] of commands) multi.call(String(command), ...args);
    const replies = (await this.race(multi.exec(), 'MULTI', this.timeoutMs)) as [Error | null, unknown][] | null;
    if (!replies) throw new RateLimitReplyError('MULTI was aborted');
    return replies.map(([err, reply], i) => {
      if (err) throw fromClientError(err, String(commands[i]![0]));
      return reply;
    });
  }

  /** A limiter call: parsed, with the failure policy applied. `limit` fills a failed-open result. */
  private decide(command: string, args: Arg[], options: CallOptions, limit: number, windowMs: number | undefined,
    extra?: Extra): Promise<RateLimitResult> {
    const kind: Extra = extra ?? (options.partial ? 'granted' : 'none');
    const cost = options.cost ?? 1;
    return this.send(command, args, options.block).then(
      (reply) => parseResult(reply, command, kind, cost, windowMs),
      (err: unknown) => this.failOpen(err, () => openResult(limit, windowMs, cost)),
    );
  }

  private failOpen<T>(err: unknown, open: () => T): T {
    if (this.failMode === 'open' && isUnavailable(err)) {
      this.onError?.(err as RateLimitError);
      return open();
    }
    throw err;
  }

  /**
   * Sends one command; rejects with a typed error, at the latest after
   * timeoutMs (plus the BLOCK timeout for a waiting call; never for BLOCK 0).
   */
  send(command: string, args: Arg[], block?: Duration): Promise<unknown> {
    const waitMs = block === undefined ? 0 : durationMs(block);
    const conn = block === undefined ? this.connection : this.blocking;
    const call = conn.call(command, ...args);
    if (waitMs === 0 && block !== undefined) return call.catch((e: unknown) => { throw fromClientError(e, command); });
    return this.race(call, command, this.timeoutMs + (waitMs ?? 0));
  }

  /** The call's result, or a typed error; RateLimitTimeoutError after limitMs. One promise, one timer: this is the hot path. */
  private race(call: Promise<unknown>, command: string, limitMs: number): Promise<unknown> {
    return new Promise((resolve, reject) => {
      // The rejection waits for the poll phase after the timer: when the
      // event loop was busy past the deadline, a reply already read wins.
      const timer = setTimeout(() => setImmediate(() => reject(new RateLimitTimeoutError(command, limitMs))), limitMs);
      call.then(
        (reply) => { clearTimeout(timer); resolve(reply); },
        (err: unknown) => { clearTimeout(timer); reject(fromClientError(err, command)); },
      );
    });
  }
}

/** withLease: no slot was granted. `result` is the denial (its `retryAfterMs` says when one is due). */
export class LeaseDeniedError extends RateLimitError {
  override name = 'LeaseDeniedError';
  readonly result: RateLimitResult;
  constructor(key: string, result: RateLimitResult) {
    super(`no lease on ${key}: ${result.limit} slots held${result.retryAfterMs >= 0 ? `, one is due in ${result.retryAfterMs} ms` : ''}`);
    this.result = result;
  }
}

function limitOf(l: Limiter | PolicyRef): number {
  return l.algorithm === 'policy' ? 0 : limitSize(l);
}

function openResult(limit: number, windowMs: number | undefined, cost = 1): RateLimitResult {
  return new RateLimitResult({ allowed: true, limit, remaining: limit, retryAfterMs: 0, resetAfterMs: 0, granted: cost, windowMs, failedOpen: true });
}
