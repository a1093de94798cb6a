/**
 * A local deny cache: a key the server denied stays denied here until its
 * `retryAfterMs` (docs/scale.md, "Local deny cache").
 *
 * During an attack most requests on a hot key are denied, and each denial
 * costs a round trip to the one primary that holds the key. The server's
 * denial says how long it lasts, so this process can give the same answer
 * itself until then.
 *
 * What a denial proves, and so what is denied here:
 * - A denial of cost `c` says nothing about a smaller cost: only requests of
 *   cost `>= c` are denied locally. A `partial` request is denied by the
 *   server only when not one unit is left, so it stands for cost 1 (and is
 *   answered here only from a denial of cost 1 or a partial one).
 * - Only for the same limiter definition and the same `lockout`: a denied
 *   call with `lockout` locks the key on the server, which a local answer
 *   would skip.
 * - Without refunds every limiter refills over time and other clients only
 *   take more, so nothing the server would admit is denied here. The one
 *   trade-off: a refund, unlock, `DEL` or policy change made by *another*
 *   process is not seen until the denial runs out. This process's own
 *   `refund`, `unlock` and `reset` forget the key.
 * - Never cached: stored policies (`limit()`: the definition behind a name can
 *   change), `countDenied` sliding logs (the server logs each denial), `block`
 *   calls, failed-open results, and denials that can never pass
 *   (`retryAfterMs` -1: the caller's bug, not traffic).
 *
 * Time is a monotonic clock in ms (`performance.now()`), never the wall
 * clock. A denial counts from when the request was *sent* (the server
 * decided later, so its own deadline is later), less `slackMs` for the
 * server's rounding to whole ms and its per-command cached clock. At most
 * `maxKeys` entries, the least recently used evicted first.
 */
import { type CallOptions, type Limiter, durationMs, windowOf } from './limiters.js';
import { RateLimitResult } from './result.js';

export interface DenyCacheOptions {
  /** Entries kept at most (default 10,000); the least recently used go first. */
  maxKeys?: number;
  /** Subtracted from each denial's end, in ms (default 2). */
  slackMs?: number;
  /** A monotonic clock in ms (default `performance.now`); tests pass a fake one. */
  clock?: () => number;
}

/** One request as the cache sees it; `DenyCache.query` builds it (undefined: not cacheable). */
export interface DenyQuery {
  readonly key: string;
  /** The key, definition and lockout: what a denial is remembered under. */
  readonly entry: string;
  /** The cost a denial of this request proves denied, and the cost this request needs. */
  readonly cost: number;
  readonly dryRun: boolean;
  readonly lockout: boolean;
  readonly windowMs: number | undefined;
}

/** When a request left: `DenyCache.sending()` before sending, given back to `record`. */
export interface Sent { readonly at: number; readonly generation: number }

interface Denial { key: string; denyUntil: number; retryAt: number; resetAt: number; cost: number; limit: number; remaining: number }

/**
 * Denials remembered per (key, definition, lockout) until their
 * `retryAfterMs`. Give one to `new RateLimitClient(conn, { denyCache })`:
 * that client's `check`, `tokenBucket`, `window`, `slidingLog` and `gcra`
 * consult it. Off unless given; one cache can serve several clients of one
 * process.
 */
export class DenyCache {
  readonly maxKeys: number;
  readonly slackMs: number;
  readonly clock: () => number;
  /** Requests answered locally, for metrics. */
  localDenials = 0;
  // A Map iterates in insertion order: deleting and setting again moves an entry to the end, so the first is the LRU.
  private readonly entries = new Map<string, Denial>();
  private readonly byKey = new Map<string, Set<string>>();
  // A reply to a request sent before this process's own refund of the key must not be
  // remembered when it arrives after it: the refund may have made the request pass.
  private generation = 0;
  private readonly forgotten = new Map<string, number>();
  private forgottenBefore = 0;

  constructor(options: DenyCacheOptions = {}) {
    this.maxKeys = options.maxKeys ?? 10_000;
    if (!Number.isInteger(this.maxKeys) || this.maxKeys < 1) throw new RangeError('maxKeys must be a whole number >= 1');
    this.slackMs = options.slackMs ?? 2;
    this.clock = options.clock ?? (() => performance.now());
  }

  /** How many denials are remembered. */
  get size(): number {
    return this.entries.size;
  }

  /** The request as a cache query; undefined for the calls the cache must not answer. */
  static query(key: string, limiter: Limiter, options: CallOptions = {}): DenyQuery | undefined {
    if (options.block !== undefined) return undefined;
    if (limiter.algorithm === 'slidinglog' && limiter.countDenied) return undefined;
    const lockout = options.lockout === undefined ? '' : String(durationMs(options.lockout) ?? options.lockout);
    return {
      key,
      entry: JSON.stringify([key, definition(limiter), lockout]),
      cost: options.partial ? 1 : options.cost ?? 1,
      dryRun: options.dryRun ?? false,
      lockout: options.lockout !== undefined,
      windowMs: windowOf(limiter),
    };
  }

  /** The local denial for `query`, or undefined: ask the server. */
  check(query: DenyQuery): RateLimitResult | undefined {
    const denial = this.entries.get(query.entry);
    if (denial === undefined) return undefined;
    const now = this.clock();
    if (now >= denial.denyUntil) {
      this.remove(query.key, query.entry);
      return undefined;
    }
    if (query.cost < denial.cost) return undefined;
    this.entries.delete(query.entry);
    this.entries.set(query.entry, denial);
    this.localDenials++;
    const retryAfterMs = Math.max(1, Math.ceil(denial.retryAt - now));
    return new RateLimitResult({
      allowed: false, limit: denial.limit, remaining: denial.remaining, retryAfterMs,
      resetAfterMs: Math.max(retryAfterMs, Math.ceil(denial.resetAt - now)), granted: 0, windowMs: query.windowMs, local: true,
    });
  }

  /** Call just before sending the request; hand the mark to `record`. */
  sending(): Sent {
    return { at: this.clock(), generation: this.generation };
  }

  /** Learn from the server's answer to `query`, sent at `sent`. */
  record(query: DenyQuery, sent: Sent, result: RateLimitResult): void {
    if (result.allowed || result.failedOpen || result.retryAfterMs < 0) return;
    if (query.dryRun && query.lockout) return; // a dry run does not lock: it cannot stand for a call that would
    if (sent.generation < this.forgottenBefore || (this.forgotten.get(query.key) ?? -1) > sent.generation) return;
    const retryAt = sent.at + result.retryAfterMs;
    const denial: Denial = {
      key: query.key, denyUntil: retryAt - this.slackMs, retryAt, resetAt: sent.at + result.resetAfterMs,
      cost: query.cost, limit: result.limit, remaining: result.remaining,
    };
    if (denial.denyUntil <= sent.at) return;
    this.entries.delete(query.entry);
    this.entries.set(query.entry, denial);
    let entries = this.byKey.get(query.key);
    if (entries === undefined) this.byKey.set(query.key, (entries = new Set()));
    entries.add(query.entry);
    for (const [oldest, { key }] of this.entries) {
      if (this.entries.size <= this.maxKeys) break;
      this.remove(key, oldest);
    }
  }

  /** Drop every denial of `key` (after a refund, unlock or reset made by this process). */
  forget(key: string): void {
    for (const entry of this.byKey.get(key) ?? []) this.entries.delete(entry);
    this.byKey.delete(key);
    this.generation++;
    this.forgotten.delete(key);
    this.forgotten.set(key, this.generation);
    // Bounded like the entries: a key dropped from this list makes every reply sent before it too old to record.
    for (const [oldest, generation] of this.forgotten) {
      if (this.forgotten.size <= this.maxKeys) break;
      this.forgotten.delete(oldest);
      this.forgottenBefore = generation;
    }
  }

  /** Forget everything. */
  clear(): void {
    this.entries.clear();
    this.byKey.clear();
    this.forgotten.clear();
    this.forgottenBefore = ++this.generation;
  }

  private remove(key: string, entry: string): void {
    this.entries.delete(entry);
    const entries = this.byKey.get(key);
    entries?.delete(entry);
    if (entries?.size === 0) this.byKey.delete(key);
  }
}

/** A limiter's definition with durations in ms where they can be read, so `'1s'` and `1000` are one entry. */
function definition(l: Limiter): (string | number | boolean)[] {
  const ms = (d: string | number): string | number => durationMs(d) ?? d;
  switch (l.algorithm) {
    case 'tokenbucket': return [l.algorithm, l.capacity, l.refillAmount, ms(l.refillPeriod)];
    case 'gcra': return [l.algorithm, l.burst, l.rate, ms(l.period)];
    case 'window': return [l.algorithm, l.limit, ms(l.period), l.sliding ?? false];
    case 'slidinglog': return [l.algorithm, l.limit, ms(l.period), l.countDenied ?? false];
    default: throw new TypeError(`unknown algorithm ${JSON.stringify((l as { algorithm: unknown }).algorithm)}`);
  }
}
