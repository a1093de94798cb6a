/**
 * Token batching: take a batch of units from the server at once, spend it in
 * this process, give back the rest (docs/scale.md, "Token batching").
 *
 * A hot limit shared by many processes costs one round trip per request to
 * the one primary that holds its key. Here a process asks for `n` units with
 * `COST n PARTIAL` (it takes what is there), admits requests from them
 * without a round trip, and gives back what it did not use with `RL.REFUND`
 * when it goes idle, on `close()`, or before the units would go stale. `n`
 * is about `targetMs` of the process's own recent rate, within
 * `[minBatch, maxBatch]`.
 *
 * What it guarantees:
 * - Fixed windows stay exact: units are spent only in the window they were
 *   taken in (until the reply's `resetAfterMs`, counted from when the request
 *   was sent, less `slackMs`). A refund must reach the server before that
 *   window ends, or it would give the units to the next window: refunds are
 *   sent no later than `refundMarginMs` before the end, and in that last
 *   stretch the process takes only what waiting requests need. That margin
 *   is the one assumption.
 * - Token buckets and GCRA: units are spent within `maxHoldMs` of being
 *   taken, so over any span `T` at most `capacity + rate * (T + maxHold)`
 *   are admitted. Refunds are always safe (the server caps them).
 * - Sliding windows, sliding logs and policies are refused: a unit spent
 *   after it was logged lets a sliding span admit up to a batch more.
 * - It admits less than the limit while units sit unused in other
 *   processes: at most their batches, until they spend or give them back.
 *
 * Node runs one piece of JavaScript at a time, so every decision about held
 * units (spend, take, give back) is made between two awaits and cannot
 * interleave with another. What needs care is the awaits: callers that run
 * short while a batch is on its way wait for that one request (never one
 * each), are served in the order they came when it lands, and re-check
 * everything (the deadline included) after waking, since time has passed.
 * Units set aside for a caller's exact top-up leave the shared count while
 * its request is out, so nobody else can spend them.
 */
import { type Gcra, type TokenBucket, type Window, limitSize, windowOf } from './limiters.js';
import type { RateLimitClient } from './client.js';
import { RateLimitResult, withFields } from './result.js';

/** The limiters a batch can be taken from: a fixed window, a token bucket, GCRA. */
export type Batchable = Window | TokenBucket | Gcra;

export interface TokenBatcherOptions {
  /** A batch is about this many ms of the process's recent rate (default 300). */
  targetMs?: number;
  /** Smallest batch (default 1). */
  minBatch?: number;
  /** Largest batch (default a tenth of the limit): what one process may keep from the others. */
  maxBatch?: number;
  /** Time constant of the rate estimate, ms (default 1000). */
  tauMs?: number;
  /** Give units back after this long without a request, ms (default `targetMs`). */
  idleAfterMs?: number;
  /** Fixed windows: last moment to give units back, before the window ends, ms (default 100). */
  refundMarginMs?: number;
  /** Token buckets and GCRA: spend units within this long of taking them, ms (default `targetMs`). */
  maxHoldMs?: number;
  /** After the server denied, deny locally for at most this long, ms (default `targetMs`). */
  recheckMs?: number;
  /** Taken off every deadline the server's reply gives, ms (default 2). */
  slackMs?: number;
  /** Give units back by a timer when idle and before the window's refund deadline (default true); the timer never keeps the process alive. */
  background?: boolean;
  /** A monotonic clock in ms (default `performance.now`); tests pass a fake one. */
  clock?: () => number;
}

/** What a batcher did: for the server calls per admitted request. */
export class BatchStats {
  admitted = 0;
  denied = 0;
  deniedLocally = 0;
  /** Batch requests (`COST n PARTIAL`) and exact top-ups. */
  takes = 0;
  refunds = 0;
  taken = 0;
  refunded = 0;
  /** Units that went stale unspent and could not be given back. */
  dropped = 0;

  get serverCalls(): number {
    return this.takes + this.refunds;
  }
}

/** One batch request, as every caller that waited for it sees it. */
interface Take { reply: RateLimitResult; asked: number; granted: number }

const closedError = (): Error => new Error('the batcher is closed');

/**
 * One (key, limit) spent in batches by this process. `await acquire(cost)`
 * where you would call the limiter; `await close()` when done (the unused
 * units go back to the server).
 */
export class TokenBatcher {
  readonly client: RateLimitClient;
  readonly key: string;
  readonly limit: Batchable;
  readonly targetMs: number;
  readonly minBatch: number;
  readonly maxBatch: number;
  readonly tauMs: number;
  readonly idleAfterMs: number;
  readonly refundMarginMs: number;
  readonly maxHoldMs: number;
  readonly recheckMs: number;
  readonly slackMs: number;
  readonly clock: () => number;
  readonly stats = new BatchStats();

  private readonly fixedWindow: boolean;
  private readonly size: number;
  private readonly windowMs: number | undefined;
  private heldUnits = 0;
  /** The held units may be spent before this moment, and given back before `refundBy`. */
  private spendUntil = 0;
  private refundBy = 0;
  private resetAt = 0;
  private lastRemaining = 0;
  private deniedUntil = 0;
  private denial: RateLimitResult | undefined;
  private rateValue = 0;
  private lastUse: number;
  private closed = false;
  /** The batch request on its way, which every caller that runs short waits for. */
  private taking: Promise<Take> | undefined;
  /** The cost of the callers waiting for `taking` (so the next batch serves them all). */
  private waiting = 0;
  /** Server calls on their way, for `close()` to wait for. */
  private readonly inFlight = new Set<Promise<unknown>>();
  private readonly timer: ReturnType<typeof setInterval> | undefined;

  constructor(client: RateLimitClient, key: string, limit: Batchable, options: TokenBatcherOptions = {}) {
    const algorithm = (limit as { algorithm?: unknown }).algorithm;
    if (algorithm === 'window' && (limit as Window).sliding) {
      throw new TypeError('a sliding window cannot be batched exactly: use a fixed window, a token bucket or GCRA');
    }
    if (algorithm !== 'window' && algorithm !== 'tokenbucket' && algorithm !== 'gcra') {
      throw new TypeError(`cannot batch ${JSON.stringify(algorithm)}: use a fixed window, a token bucket or GCRA`);
    }
    this.client = client;
    this.key = key;
    this.limit = limit;
    this.targetMs = options.targetMs ?? 300;
    this.minBatch = Math.max(1, options.minBatch ?? 1);
    this.size = limitSize(limit);
    this.maxBatch = Math.max(this.minBatch, options.maxBatch ?? Math.floor(this.size / 10));
    this.tauMs = options.tauMs ?? 1000;
    this.idleAfterMs = options.idleAfterMs ?? this.targetMs;
    this.refundMarginMs = options.refundMarginMs ?? 100;
    this.maxHoldMs = options.maxHoldMs ?? this.targetMs;
    this.recheckMs = options.recheckMs ?? this.targetMs;
    this.slackMs = options.slackMs ?? 2;
    this.clock = options.clock ?? (() => performance.now());
    this.fixedWindow = algorithm === 'window';
    this.windowMs = windowOf(limit);
    this.lastUse = this.clock();
    if (options.background ?? true) {
      this.timer = setInterval(() => { this.maintain().catch(() => { /* a failed refund only leaves units unused */ }); }, this.tick());
      this.timer.unref();
    }
  }

  /** Units taken from the server and not yet spent or given back. */
  get held(): number {
    return this.heldUnits;
  }

  /** This process's recent rate, units per second. */
  get rate(): number {
    return this.rateValue;
  }

  /** `targetMs` of the recent rate, within `[minBatch, maxBatch]`. */
  batchSize(): number {
    return Math.min(this.maxBatch, Math.max(this.minBatch, Math.ceil((this.rateValue * this.targetMs) / 1000)));
  }

  /**
   * Admit a request of `cost`: from the held units when there are enough
   * (`local: true`, no round trip), else from a new batch. Rejects after
   * `close()`, and with the client's error when the server cannot be asked.
   */
  async acquire(cost = 1): Promise<RateLimitResult> {
    if (!Number.isInteger(cost) || cost < 1) throw new RangeError('cost must be a whole number >= 1');
    if (this.closed) throw closedError();
    this.noteUse(this.clock(), cost);
    let waited: Take | undefined; // the last batch this call waited for
    let awaited = false;
    for (;;) {
      const now = this.clock();
      this.expire(now);
      if (this.heldUnits >= cost) return this.spend(cost, now, !awaited);
      if (waited?.reply.failedOpen) return this.failedOpen(waited.reply, cost);
      if (waited !== undefined && waited.granted === 0) {
        this.stats.denied++;
        return waited.reply;
      }
      if (now < this.deniedUntil && this.denial !== undefined) {
        this.stats.denied++;
        this.stats.deniedLocally++;
        return this.localDenial(now, this.denial);
      }
      if (this.closed) throw closedError();
      if (waited !== undefined && waited.granted < waited.asked && this.heldUnits > 0) {
        // The server ran short of this request: one exact call for the rest tells when it will be there.
        const topped = await this.topUp(cost);
        if (topped !== undefined) return topped;
        waited = undefined;
        continue;
      }
      this.taking ??= this.take(cost, now);
      this.waiting += cost;
      try {
        waited = await this.taking;
      } finally {
        this.waiting -= cost;
        awaited = true;
      }
    }
  }

  /** Give units back when idle for `idleAfterMs`, or before their refund deadline; drop stale ones. */
  maintain(): Promise<void> {
    const now = this.clock();
    this.expire(now);
    const idle = now - this.lastUse >= this.idleAfterMs;
    if (this.heldUnits > 0 && (idle || now + this.tick() >= this.refundBy)) return this.giveBack(now);
    return Promise.resolve();
  }

  /** Give back every unused unit now (if it can still reach the server in time). */
  flush(): Promise<void> {
    return this.giveBack(this.clock());
  }

  /**
   * Stop the timer, let the requests on their way land (their callers are
   * served first), then give back what is left. Idempotent; rejects when that
   * last refund fails.
   */
  async close(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    if (this.closed) return this.settle();
    this.closed = true;
    await this.settle();
    const now = this.clock();
    this.expire(now);
    const last = this.giveBack(now);
    await this.settle();
    await last;
  }

  private async settle(): Promise<void> {
    while (this.inFlight.size > 0) {
      await Promise.allSettled([...this.inFlight]);
      // The callers woken by those replies run before close() goes on: they spend first.
      await new Promise((resolve) => setImmediate(resolve));
    }
  }

  private track<T>(call: Promise<T>): Promise<T> {
    this.inFlight.add(call);
    const done = (): void => { this.inFlight.delete(call); };
    call.then(done, done);
    return call;
  }

  private tick(): number {
    return Math.max(5, Math.min(this.idleAfterMs, this.refundMarginMs) / 2);
  }

  private noteUse(now: number, cost: number): void {
    const elapsed = Math.max(0, now - this.lastUse);
    this.rateValue = this.rateValue * Math.exp(-elapsed / this.tauMs) + cost / (this.tauMs / 1000);
    this.lastUse = now;
  }

  /** Units past `spendUntil` may no longer be spent: give them back if that is still safe. */
  private expire(now: number): void {
    if (this.heldUnits > 0 && now >= this.spendUntil) {
      const units = this.heldUnits;
      this.heldUnits = 0;
      this.discard(units, now, this.refundBy);
    }
  }

  private discard(units: number, now: number, refundBy: number): void {
    if (now < refundBy) this.refund(units).catch(() => { /* counted as dropped */ });
    else this.stats.dropped += units;
  }

  private giveBack(now: number): Promise<void> {
    if (this.heldUnits === 0 || now >= this.refundBy) return Promise.resolve();
    const units = this.heldUnits;
    this.heldUnits = 0;
    return this.refund(units);
  }

  private refund(units: number): Promise<void> {
    this.stats.refunds++;
    this.stats.refunded += units;
    return this.track(this.client.refund(this.key, units)).then(() => undefined, (err: unknown) => {
      this.stats.refunded -= units;
      this.stats.dropped += units;
      throw err;
    });
  }

  private spend(cost: number, now: number, local: boolean): RateLimitResult {
    this.heldUnits -= cost;
    this.stats.admitted += cost;
    return new RateLimitResult({
      allowed: true, limit: this.size, remaining: this.lastRemaining + this.heldUnits, retryAfterMs: 0,
      resetAfterMs: Math.max(0, Math.ceil(this.resetAt - now)), granted: cost, windowMs: this.windowMs, local,
    });
  }

  private localDenial(now: number, denial: RateLimitResult): RateLimitResult {
    const retryAfterMs = Math.max(1, Math.ceil(this.deniedUntil + this.slackMs - now));
    return new RateLimitResult({
      allowed: false, limit: denial.limit, remaining: 0, retryAfterMs,
      resetAfterMs: Math.max(retryAfterMs, denial.resetAfterMs), granted: 0, windowMs: this.windowMs, local: true,
    });
  }

  private failedOpen(reply: RateLimitResult, cost: number): RateLimitResult {
    if (reply.allowed) this.stats.admitted += cost;
    else this.stats.denied++;
    return withFields(reply, { granted: reply.allowed ? cost : 0 });
  }

  /** One batch request, for this caller and every one that waits for it. */
  private take(cost: number, now: number): Promise<Take> {
    const need = cost - this.heldUnits + this.waiting;
    // In a window's last stretch a refund could land in the next window: take only what the waiting requests need.
    const lastStretch = this.refundBy <= now && now < this.spendUntil;
    const asked = lastStretch ? need : Math.max(need, Math.min(this.maxBatch, Math.max(this.batchSize(), need)));
    const sentAt = this.clock();
    const request = this.track(this.client.check(this.key, this.limit, { cost: asked, partial: true }));
    const taking = request.then((reply) => {
      this.stats.takes++;
      const granted = reply.failedOpen ? 0 : reply.granted ?? 0;
      if (!reply.failedOpen) this.lastRemaining = reply.remaining;
      if (granted > 0) this.add(granted, sentAt, reply);
      else if (!reply.failedOpen) {
        this.deniedUntil = sentAt + Math.min(reply.retryAfterMs - this.slackMs, this.recheckMs);
        this.denial = reply;
      }
      return { reply, asked, granted };
    });
    const clear = (): void => { if (this.taking === taking) this.taking = undefined; };
    taking.then(clear, clear);
    return taking;
  }

  /** Units taken: spendable until the window ends (or `maxHoldMs`), refundable until `refundMarginMs` before that. */
  private add(units: number, sentAt: number, reply: RateLimitResult): void {
    const now = this.clock();
    this.expire(now); // older units gone stale must not shorten the new ones' deadline
    let spendUntil: number, refundBy: number;
    if (this.fixedWindow) {
      spendUntil = sentAt + reply.resetAfterMs - this.slackMs;
      refundBy = spendUntil - this.refundMarginMs;
    } else {
      spendUntil = sentAt + this.maxHoldMs;
      refundBy = Infinity;
    }
    if (this.heldUnits > 0) {
      // Older units keep their earlier deadlines: all expire at the earliest (fewer admitted, never more).
      spendUntil = Math.min(spendUntil, this.spendUntil);
      refundBy = Math.min(refundBy, this.refundBy);
    }
    this.heldUnits += units;
    this.stats.taken += units;
    this.spendUntil = spendUntil;
    this.refundBy = refundBy;
    this.resetAt = sentAt + reply.resetAfterMs;
  }

  /**
   * The held units are set aside for this caller and the rest is asked for
   * exactly (not partial): admitted when it comes while they are still good;
   * put back when denied. Undefined: they went stale meanwhile, try again.
   */
  private async topUp(cost: number): Promise<RateLimitResult | undefined> {
    const reserved = this.heldUnits;
    const [until, refundBy] = [this.spendUntil, this.refundBy];
    this.heldUnits = 0;
    const rest = cost - reserved;
    const sentAt = this.clock();
    const reply = await this.track(this.client.check(this.key, this.limit, { cost: rest }));
    this.stats.takes++;
    const now = this.clock();
    if (reply.failedOpen || !reply.allowed) {
      this.putBack(reserved, until, refundBy, now);
      if (reply.failedOpen) return this.failedOpen(reply, cost);
      this.stats.denied++;
      return reply;
    }
    if (now < until) {
      this.stats.taken += rest;
      this.stats.admitted += cost;
      this.lastRemaining = reply.remaining;
      return withFields(reply, { granted: cost, remaining: reply.remaining + this.heldUnits });
    }
    this.discard(reserved, now, refundBy);
    this.add(rest, sentAt, reply);
    return undefined;
  }

  private putBack(units: number, until: number, refundBy: number, now: number): void {
    if (now >= until) {
      this.discard(units, now, refundBy);
      return;
    }
    this.expire(now);
    if (this.heldUnits > 0) {
      until = Math.min(until, this.spendUntil);
      refundBy = Math.min(refundBy, this.refundBy);
    }
    this.heldUnits += units;
    this.spendUntil = until;
    this.refundBy = refundBy;
    if (this.closed) this.giveBack(now).catch(() => { /* counted as dropped */ });
  }
}
