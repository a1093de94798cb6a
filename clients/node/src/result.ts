/**
 * Typed replies and the HTTP headers they map to
 * (README: "Reply" and "HTTP 429, Retry-After and RateLimit headers").
 */
import { RateLimitReplyError } from './errors.js';

/** Header names to values, ready for `res.set(headers)` or `res.setHeader` in a loop. */
export type RateLimitHeaders = Record<string, string>;

export interface HeaderOptions {
  /** The policy's name in `RateLimit-Policy` / `RateLimit` (default `"default"`). */
  name?: string;
  /** `w=` of `RateLimit-Policy`, in seconds; omitted when the window is not known. */
  windowSeconds?: number;
  /** Set `RateLimit-Policy` / `RateLimit` (default true). */
  standard?: boolean;
  /** Set `X-RateLimit-Limit`, `-Remaining`, `-Reset` (default true). */
  legacy?: boolean;
}

const seconds = (ms: number): number => Math.ceil(ms / 1000); // a client that waits this long is never early

/** One limiter's decision: the module's five fields, plus the extra ones of PARTIAL, RL.REFUND and RL.LEASE. */
export class RateLimitResult {
  /** True when the request was allowed (and consumed, unless a dry run or cost 0). */
  readonly allowed: boolean;
  readonly limit: number;
  /** What could still be consumed now, after this request. */
  readonly remaining: number;
  /** 0 when allowed; when denied, ms until the same request would pass; -1 when it never can. */
  readonly retryAfterMs: number;
  /** ms until the limiter is completely full again. */
  readonly resetAfterMs: number;
  /** PARTIAL: how much was granted. Otherwise the cost when allowed, 0 when denied (undefined when the cost is not known: RL.PEEK). */
  readonly granted: number | undefined;
  /** RL.REFUND: how much came back. */
  readonly refunded: number | undefined;
  /** RL.LEASE: the lease's id, null when none was granted. */
  readonly leaseId: string | null | undefined;
  /** RL.LEASE: the granted lease's time to live (0 when none). */
  readonly leaseTtlMs: number | undefined;
  /** `w=` for the headers when the call's window is known (period, or the time to refill a burst). */
  readonly windowMs: number | undefined;
  /** True when the limiter was unavailable and the client is set to fail open: this is not a decision of the server. */
  readonly failedOpen: boolean;
  /**
   * True when this process decided without asking the server: a denial the
   * deny cache still remembers, or units spent from a token batch.
   */
  readonly local: boolean;

  constructor(fields: {
    allowed: boolean; limit: number; remaining: number; retryAfterMs: number; resetAfterMs: number;
    granted?: number | undefined; refunded?: number | undefined; leaseId?: string | null | undefined;
    leaseTtlMs?: number | undefined; windowMs?: number | undefined; failedOpen?: boolean; local?: boolean;
  }) {
    this.allowed = fields.allowed;
    this.limit = fields.limit;
    this.remaining = fields.remaining;
    this.retryAfterMs = fields.retryAfterMs;
    this.resetAfterMs = fields.resetAfterMs;
    this.granted = fields.granted;
    this.refunded = fields.refunded;
    this.leaseId = fields.leaseId;
    this.leaseTtlMs = fields.leaseTtlMs;
    this.windowMs = fields.windowMs;
    this.failedOpen = fields.failedOpen ?? false;
    this.local = fields.local ?? false;
  }

  /** `Retry-After` in whole seconds (rounded up, at least 1) when denied; null when allowed or when it can never pass. */
  get retryAfterSeconds(): number | null {
    return this.allowed || this.retryAfterMs < 0 ? null : Math.max(1, seconds(this.retryAfterMs));
  }

  /**
   * The HTTP headers for this decision: `RateLimit-Policy` and `RateLimit`
   * (draft-ietf-httpapi-ratelimit-headers), `X-RateLimit-Limit`,
   * `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds until full), and
   * `Retry-After` when denied (seconds, rounded up; absent when the request
   * can never pass). A result that failed open has no headers.
   */
  headers(options: HeaderOptions = {}): RateLimitHeaders {
    if (this.failedOpen) return {};
    return headersFor([{ result: this, name: options.name ?? 'default', windowSeconds: options.windowSeconds ?? windowSeconds(this) }],
      this.retryAfterSeconds, options);
  }

  toJSON(): Record<string, unknown> {
    const out: Record<string, unknown> = {
      allowed: this.allowed, limit: this.limit, remaining: this.remaining,
      retryAfterMs: this.retryAfterMs, resetAfterMs: this.resetAfterMs,
    };
    for (const k of ['granted', 'refunded', 'leaseId', 'leaseTtlMs'] as const) if (this[k] !== undefined) out[k] = this[k];
    if (this.failedOpen) out.failedOpen = true;
    if (this.local) out.local = true;
    return out;
  }
}

/** `result` with some fields changed (results are immutable). */
export function withFields(result: RateLimitResult, changes: Partial<ConstructorParameters<typeof RateLimitResult>[0]>): RateLimitResult {
  return new RateLimitResult({
    allowed: result.allowed, limit: result.limit, remaining: result.remaining, retryAfterMs: result.retryAfterMs,
    resetAfterMs: result.resetAfterMs, granted: result.granted, refunded: result.refunded, leaseId: result.leaseId,
    leaseTtlMs: result.leaseTtlMs, windowMs: result.windowMs, failedOpen: result.failedOpen, local: result.local, ...changes,
  });
}

/** RL.ALL's decision: all or nothing over several limiters. */
export class AllResult {
  readonly allowed: boolean;
  /** The longest of the limiters' waits; -1 when one can never allow the call. */
  readonly retryAfterMs: number;
  /** PARTIAL: how much every limiter granted. */
  readonly granted: number | undefined;
  /** One result per limiter, in the order given. */
  readonly limiters: RateLimitResult[];
  /** The limiters' names, in the same order (for the headers). */
  readonly names: string[];
  readonly failedOpen: boolean;

  constructor(allowed: boolean, retryAfterMs: number, granted: number | undefined, limiters: RateLimitResult[], names: string[], failedOpen = false) {
    this.allowed = allowed;
    this.retryAfterMs = retryAfterMs;
    this.granted = granted;
    this.limiters = limiters;
    this.names = names;
    this.failedOpen = failedOpen;
  }

  get retryAfterSeconds(): number | null {
    return this.allowed || this.retryAfterMs < 0 ? null : Math.max(1, seconds(this.retryAfterMs));
  }

  /**
   * The most restrictive limiter: least remaining, then the longest wait
   * (never counts as longest), then the longest reset, then the first.
   */
  get binding(): RateLimitResult {
    const wait = (ms: number): number => (ms < 0 ? Infinity : ms);
    return this.limiters.reduce((best, l) => {
      const a = [l.remaining, -wait(l.retryAfterMs), -l.resetAfterMs];
      const b = [best.remaining, -wait(best.retryAfterMs), -best.resetAfterMs];
      for (let k = 0; k < 3; k++) if (a[k] !== b[k]) return a[k]! < b[k]! ? l : best;
      return best;
    });
  }

  /** One `RateLimit-Policy` / `RateLimit` item per limiter; `X-RateLimit-*` from the binding one; `Retry-After` when denied. */
  headers(options: Omit<HeaderOptions, 'name' | 'windowSeconds'> = {}): RateLimitHeaders {
    if (this.failedOpen) return {};
    const items = this.limiters.map((result, i) => ({ result, name: this.names[i] ?? `l${i}`, windowSeconds: windowSeconds(result) }));
    return headersFor(items, this.retryAfterSeconds, options, this.binding);
  }
}

const windowSeconds = (r: RateLimitResult): number | undefined => (r.windowMs === undefined ? undefined : seconds(r.windowMs));

function headersFor(items: { result: RateLimitResult; name: string; windowSeconds: number | undefined }[],
  retryAfter: number | null, options: HeaderOptions, legacyFrom: RateLimitResult = items[0]!.result): RateLimitHeaders {
  const h: RateLimitHeaders = {};
  const quote = (name: string): string => `"${name.replace(/["\\]/g, '')}"`;
  if (options.standard ?? true) {
    h['RateLimit-Policy'] = items.map(({ result, name, windowSeconds: w }) =>
      `${quote(name)};q=${result.limit}${w === undefined ? '' : `;w=${w}`}`).join(', ');
    h.RateLimit = items.map(({ result, name }) => `${quote(name)};r=${result.remaining};t=${seconds(result.resetAfterMs)}`).join(', ');
  }
  if (options.legacy ?? true) {
    h['X-RateLimit-Limit'] = String(legacyFrom.limit);
    h['X-RateLimit-Remaining'] = String(legacyFrom.remaining);
    h['X-RateLimit-Reset'] = String(seconds(legacyFrom.resetAfterMs));
  }
  if (retryAfter !== null) h['Retry-After'] = String(retryAfter);
  return h;
}

// ---- replies (RESP2 arrays; RESP3 maps come as objects when a client speaks RESP3) ----

const int = (v: unknown, what: string): number => {
  if (typeof v === 'number' && Number.isInteger(v)) return v;
  if (typeof v === 'string' && /^-?\d+$/.test(v)) return Number(v);
  throw new RateLimitReplyError(`unexpected ${what} in reply: ${JSON.stringify(v)}`);
};

/**
 * A RESP3 map as an object: clients that speak RESP3 (ioredis 6 by default)
 * hand it over as an object or as a flat `[name, value, ...]` array.
 */
function asMap(reply: unknown): Record<string, unknown> | undefined {
  if (Array.isArray(reply)) {
    if (reply[0] !== 'allowed') return undefined;
    const m: Record<string, unknown> = {};
    for (let i = 0; i + 1 < reply.length; i += 2) m[String(reply[i])] = reply[i + 1];
    return m;
  }
  return reply && typeof reply === 'object' && !Buffer.isBuffer(reply) ? (reply as Record<string, unknown>) : undefined;
}

/** The fields of a five-field reply (array or map), with what follows them. */
function fields(reply: unknown, command: string): unknown[] {
  const m = asMap(reply);
  if (m) return [m.allowed, m.limit, m.remaining, m.retry_after_ms, m.reset_after_ms, m.granted ?? m.refunded ?? m.lease_id, m.lease_ttl_ms];
  if (Array.isArray(reply) && reply.length >= 5) return reply;
  throw new RateLimitReplyError(`unexpected ${command} reply: ${JSON.stringify(reply)}`);
}

export type Extra = 'none' | 'granted' | 'refunded' | 'lease';

/** A limiter command's reply as a result; `cost` fills `granted` for all-or-nothing calls. */
export function parseResult(reply: unknown, command: string, extra: Extra, cost: number | undefined, windowMs?: number): RateLimitResult {
  const f = fields(reply, command);
  const allowed = int(f[0], 'allowed') === 1;
  const limit = int(f[1], 'limit');
  const remaining = int(f[2], 'remaining');
  const retryAfterMs = int(f[3], 'retry_after_ms');
  const resetAfterMs = int(f[4], 'reset_after_ms');
  let granted = cost === undefined ? undefined : allowed ? cost : 0;
  let refunded: number | undefined;
  let leaseId: string | null | undefined;
  let leaseTtlMs: number | undefined;
  if (extra === 'granted') granted = int(f[5], 'granted');
  else if (extra === 'refunded') refunded = int(f[5], 'refunded');
  else if (extra === 'lease') {
    leaseId = f[5] === null || f[5] === undefined ? null : String(f[5]);
    leaseTtlMs = int(f[6] ?? 0, 'lease_ttl_ms');
  }
  return new RateLimitResult({ allowed, limit, remaining, retryAfterMs, resetAfterMs, granted, refunded, leaseId, leaseTtlMs, windowMs });
}

/** RL.ALL's reply: `[allowed, retry_after_ms, [granted,] [[five fields], ...]]`. */
export function parseAll(reply: unknown, partial: boolean, cost: number, names: string[], windows: (number | undefined)[]): AllResult {
  let allowed: unknown, retry: unknown, granted: unknown, items: unknown;
  const m = asMap(reply);
  if (m) {
    ({ allowed, retry_after_ms: retry, granted, limiters: items } = m);
  } else if (Array.isArray(reply)) {
    [allowed, retry] = reply;
    [granted, items] = partial ? [reply[2], reply[3]] : [undefined, reply[2]];
  }
  if (!Array.isArray(items) || items.length !== names.length) throw new RateLimitReplyError(`unexpected RL.ALL reply: ${JSON.stringify(reply)}`);
  const ok = int(allowed, 'allowed') === 1;
  const g = partial ? int(granted, 'granted') : ok ? cost : 0;
  const limiters = items.map((item, i) => parseResult(item, 'RL.ALL', 'none', undefined, windows[i]));
  return new AllResult(ok, int(retry, 'retry_after_ms'), g, limiters, names);
}
