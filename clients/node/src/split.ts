/**
 * Split budgets: one limit as N keys in N slots, so N primaries of a cluster
 * share its load (docs/scale.md, "Split budgets").
 *
 * One key lives on one primary, so one limit is capped by one node. Split
 * into `n` keys, each with `1/n` of the limit (the remainder given out one
 * by one, so the shares sum exactly to the limit) and spread over the slot
 * space, it lands on different primaries. The shares' limits sum to the
 * limit, so no window ever admits more than it, for every algorithm.
 *
 * A request goes to a random shard, and when that one denies it, to a second
 * (two choices). What it gives up: a request denied by both its picks while a
 * third shard still has units is denied; a request costing more than one
 * share never passes; each shard refills on its own.
 *
 * The keys are the Python package's (`shard_keys`), so processes in both
 * languages share one split limit.
 */
import type { RateLimitClient } from './client.js';
import { type Limiter, limitSize } from './limiters.js';
import { type RateLimitResult, withFields } from './result.js';

const SLOTS = 16384;

/** `total` in `n` whole parts that sum to it, the larger first (they differ by at most 1). */
export function shares(total: number, n: number): number[] {
  if (!Number.isInteger(total) || !Number.isInteger(n) || n < 1 || total < n) {
    throw new RangeError(`cannot split ${total} into ${n} shares of at least 1`);
  }
  const base = Math.floor(total / n);
  const extra = total % n;
  return Array.from({ length: n }, (_, i) => base + (i < extra ? 1 : 0));
}

/** `limit` as `n` limiters whose limits (and rates) sum exactly to its own. */
export function splitLimit(limit: Limiter, n: number): Limiter[] {
  switch (limit.algorithm) {
    case 'tokenbucket': {
      const rates = shares(limit.refillAmount, n);
      return shares(limit.capacity, n).map((capacity, i) => ({ ...limit, capacity, refillAmount: rates[i]! }));
    }
    case 'gcra': {
      const rates = shares(limit.rate, n);
      return shares(limit.burst, n).map((burst, i) => ({ ...limit, burst, rate: rates[i]! }));
    }
    case 'window':
    case 'slidinglog':
      return shares(limit.limit, n).map((part) => ({ ...limit, limit: part }));
    default:
      throw new TypeError(`cannot split ${JSON.stringify((limit as { algorithm: unknown }).algorithm)}`);
  }
}

/** The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key. */
export function keySlot(key: string): number {
  let bytes = Buffer.from(key, 'utf8');
  const open = bytes.indexOf(0x7b); // '{'
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1); // '}'
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % SLOTS;
}

/** CRC-32 (zlib's, as Python's `zlib.crc32`) of the UTF-8 bytes, as 8 hex digits. */
function crc32Hex(text: string): string {
  let crc = 0xffffffff;
  for (const byte of Buffer.from(text, 'utf8')) {
    crc ^= byte;
    for (let bit = 0; bit < 8; bit++) crc = crc & 1 ? (crc >>> 1) ^ 0xedb88320 : crc >>> 1;
  }
  return ((crc ^ 0xffffffff) >>> 0).toString(16).padStart(8, '0');
}

/**
 * `n` keys for `key`, the i-th in a slot near the middle of the i-th of `n`
 * equal slot ranges. A cluster whose primaries own equal contiguous ranges
 * (as `valkey-cli --cluster create` assigns them) holds shard i on primary
 * `i * m / n` of its `m`; with `n` a multiple of `m`, each primary gets
 * `n / m` shards. The hash tag is a digest of `key` and a counter found by
 * search, so different keys use different slots.
 */
export function shardKeys(key: string, n: number): string[] {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`shards must be a whole number >= 1, not ${n}`);
  if (key.includes('{') || key.includes('}')) {
    throw new TypeError(`a split key carries its own hash tag; braces would override it: ${JSON.stringify(key)}`);
  }
  const digest = crc32Hex(key);
  const width = SLOTS / n;
  return Array.from({ length: n }, (_, i) => {
    const [low, high] = [(i + 0.25) * width, (i + 0.75) * width];
    for (let j = 0; ; j++) {
      const tag = `{${digest}.${i}.${j}}`;
      const slot = keySlot(tag);
      if (low <= slot && slot < high) return `${key}:${tag}`;
    }
  });
}

export interface SplitLimitOptions {
  /** Random numbers in [0, 1) for the picks (default `Math.random`); tests pass a seeded one. */
  random?: () => number;
}

/**
 * `limit` on `key`, split over `shards` keys on different slots. Give the
 * client a `DenyCache` and each shard's denial is remembered, so once every
 * shard is out, requests are denied without a call.
 */
export class SplitLimit {
  readonly client: RateLimitClient;
  readonly limit: Limiter;
  readonly keys: string[];
  readonly limits: Limiter[];
  /** The shares' limits added up: the limit's own. */
  readonly total: number;
  private readonly random: () => number;

  constructor(client: RateLimitClient, key: string, limit: Limiter, shards: number, options: SplitLimitOptions = {}) {
    this.client = client;
    this.limit = limit;
    this.keys = shardKeys(key, shards);
    this.limits = splitLimit(limit, shards);
    this.total = this.limits.reduce((sum, l) => sum + limitSize(l), 0);
    this.random = options.random ?? Math.random;
  }

  /**
   * A request of `cost` on a random shard, then on a second one if the first
   * denies it. The result is the answering shard's with `limit` the whole
   * limit (`remaining` is that shard's); on two denials, the one that frees
   * sooner.
   */
  async hit(cost = 1): Promise<RateLimitResult> {
    const [first, second] = this.picks();
    const result = await this.hitShard(first, cost);
    if (result.allowed || second === undefined) return result;
    const other = await this.hitShard(second, cost);
    if (other.allowed) return other;
    const wait = (r: RateLimitResult): number => (r.retryAfterMs < 0 ? Infinity : r.retryAfterMs);
    return wait(other) < wait(result) ? other : result;
  }

  private picks(): [number, number | undefined] {
    const n = this.keys.length;
    if (n === 1) return [0, undefined];
    const first = Math.floor(this.random() * n);
    const second = Math.floor(this.random() * (n - 1));
    return [first, second >= first ? second + 1 : second];
  }

  private async hitShard(shard: number, cost: number): Promise<RateLimitResult> {
    const result = await this.client.check(this.keys[shard]!, this.limits[shard]!, { cost });
    return withFields(result, { limit: this.total });
  }
}
