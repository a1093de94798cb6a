/** Limiter definitions, durations and options as the module's arguments. */

/**
 * A duration: a number is **milliseconds** (the JavaScript convention), a
 * string is passed to the module as it is (`'15m'`, `'250ms'`, `'2h'`, `'1d'`;
 * a bare integer string is seconds, as on the command line).
 */
export type Duration = number | string;

export interface TokenBucket { algorithm: 'tokenbucket'; capacity: number; refillAmount: number; refillPeriod: Duration }
export interface Window { algorithm: 'window'; limit: number; period: Duration; sliding?: boolean }
export interface SlidingLog { algorithm: 'slidinglog'; limit: number; period: Duration; countDenied?: boolean }
export interface Gcra { algorithm: 'gcra'; burst: number; rate: number; period: Duration }
/** A limiter: one of the four algorithms with its parameters (what RL.POLICY.SET stores). */
export type Limiter = TokenBucket | Window | SlidingLog | Gcra;
/** A stored policy by name, as one of RL.ALL's limiters. */
export interface PolicyRef { algorithm: 'policy'; name: string }

/** Per-call options (README: "Arguments"). */
export interface CallOptions {
  /** Units this request takes (default 1; 0 is a peek). */
  cost?: number;
  /** Ask without taking. */
  dryRun?: boolean;
  /** Take min(cost, remaining); the result's `granted` says how much. */
  partial?: boolean;
  /** When denied, lock the key for this long. */
  lockout?: Duration;
  /** Wait up to this long for the permit (0: no timeout). See the client's `blockTimeoutMarginMs`. */
  block?: Duration;
}

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** A duration as the module's argument. */
export function durationArg(d: Duration): string {
  if (typeof d === 'number') {
    if (!Number.isInteger(d) || d < 0) throw new RangeError(`a duration in ms must be a whole number >= 0, not ${d}`);
    return d === 0 ? '0' : `${d}ms`;
  }
  return d;
}

/** A duration in ms, or undefined when the string is not one the module would read. */
export function durationMs(d: Duration): number | undefined {
  if (typeof d === 'number') return d;
  const m = /^\s*(\d+)\s*(ms|s|m|h|d)?\s*$/i.exec(d);
  return m ? Number(m[1]) * UNIT_MS[(m[2] ?? 's').toLowerCase()]! : undefined;
}

/** The limiter's arguments after its key: `TOKENBUCKET 10 5 1s` for RL.ALL and policies. */
export function limiterArgs(l: Limiter | PolicyRef): (string | number)[] {
  switch (l.algorithm) {
    case 'tokenbucket': return ['TOKENBUCKET', l.capacity, l.refillAmount, durationArg(l.refillPeriod)];
    case 'window': return ['WINDOW', l.limit, durationArg(l.period), ...(l.sliding ? ['SLIDING'] : [])];
    case 'slidinglog': return ['SLIDINGLOG', l.limit, durationArg(l.period), ...(l.countDenied ? ['COUNTDENIED'] : [])];
    case 'gcra': return ['GCRA', l.burst, l.rate, durationArg(l.period)];
    case 'policy': return ['POLICY', l.name];
    default: throw new TypeError(`unknown algorithm ${JSON.stringify((l as { algorithm: unknown }).algorithm)}`);
  }
}

/** How many units the limiter holds when full: the capacity, the burst, or the limit. */
export function limitSize(l: Limiter): number {
  switch (l.algorithm) {
    case 'tokenbucket': return l.capacity;
    case 'gcra': return l.burst;
    default: return l.limit;
  }
}

/** The time the limiter's quota covers (`w=` of RateLimit-Policy): the period, or the time to refill a whole burst. */
export function windowOf(l: Limiter | PolicyRef): number | undefined {
  switch (l.algorithm) {
    case 'tokenbucket': { const p = durationMs(l.refillPeriod); return p === undefined ? undefined : Math.ceil((l.capacity * p) / l.refillAmount); }
    case 'gcra': { const p = durationMs(l.period); return p === undefined ? undefined : Math.ceil((l.burst * p) / l.rate); }
    case 'window': case 'slidinglog': return durationMs(l.period);
    default: return undefined;
  }
}

/** A policy definition as RL.POLICY.GET replies it (`['WINDOW', '200', '1m']`). */
export function parseLimiter(words: string[]): Limiter {
  const [kind, ...a] = words.map(String);
  const n = (i: number): number => Number(a[i]);
  switch (kind?.toUpperCase()) {
    case 'TOKENBUCKET': return { algorithm: 'tokenbucket', capacity: n(0), refillAmount: n(1), refillPeriod: a[2]! };
    case 'WINDOW': return { algorithm: 'window', limit: n(0), period: a[1]!, sliding: a[2]?.toUpperCase() === 'SLIDING' };
    case 'SLIDINGLOG': return { algorithm: 'slidinglog', limit: n(0), period: a[1]!, countDenied: a[2]?.toUpperCase() === 'COUNTDENIED' };
    case 'GCRA': return { algorithm: 'gcra', burst: n(0), rate: n(1), period: a[2]! };
    default: throw new TypeError(`unknown policy definition ${JSON.stringify(words)}`);
  }
}

/** The options as arguments, in the module's spelling. */
export function optionArgs(o: CallOptions, brief = false): (string | number)[] {
  const out: (string | number)[] = [];
  if (o.cost !== undefined) out.push('COST', o.cost);
  if (o.dryRun) out.push('DRYRUN');
  if (o.partial) out.push('PARTIAL');
  if (o.lockout !== undefined) out.push('LOCKOUT', durationArg(o.lockout));
  if (o.block !== undefined) out.push('BLOCK', durationArg(o.block));
  if (brief) out.push('BRIEF');
  return out;
}

/**
 * Keys that share one hash slot in Valkey Cluster (for RL.ALL): each name
 * gets the same hash tag, `sameSlot('user:7', 'rl:burst', 'rl:daily')` is
 * `['rl:burst:{user:7}', 'rl:daily:{user:7}']`. The names must not contain
 * `{` themselves (the slot is hashed from the first `{...}`).
 */
export function sameSlot(tag: string, ...names: string[]): string[] {
  return names.map((n) => `${n}:{${tag}}`);
}
