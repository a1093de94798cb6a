// Compiled (never run) by `npm run typecheck`: the package's declarations
// plug into the host libraries' own types.
import { rateLimit, type Store } from 'express-rate-limit';
import { Cluster, Redis as Valkey } from 'iovalkey';
import { Redis } from 'ioredis';
import { RateLimiterMemory } from 'rate-limiter-flexible';
import {
  DenyCache, RateLimitClient, RateLimiterQueue, RateLimiterUnion, RateLimiterValkey, SplitLimit, TokenBatcher, ValkeyStore,
  type Batchable, type RateLimitHeaders, type RateLimitResult,
} from '../src/index.js';

const valkey = new Valkey();
const store: Store = new ValkeyStore({ client: valkey });
rateLimit({ windowMs: 60_000, limit: 100, store });
rateLimit({ store: new ValkeyStore({ client: new Redis(), algorithm: 'sliding' }) });
new RateLimitClient(new Cluster([{ host: '127.0.0.1', port: 7000 }]));

const client = new RateLimitClient(valkey, { timeoutMs: 50, failMode: 'open' });
export async function typed(): Promise<RateLimitHeaders> {
  const r: RateLimitResult = await client.tokenBucket('k', 10, 5, '1s');
  const allowed: boolean = r.allowed;
  const retry: number = r.retryAfterMs;
  void [allowed, retry];
  return r.headers();
}

const limiter = new RateLimiterValkey({ storeClient: valkey, points: 5, duration: 1, insuranceLimiter: new RateLimiterMemory({ points: 5, duration: 1 }) });
new RateLimiterUnion(limiter, new RateLimiterValkey({ storeClient: valkey, keyPrefix: 'b' }));
new RateLimiterQueue(limiter, { maxQueueSize: 10 });
export const consumed: Promise<number> = limiter.consume('k', 2).then((res) => res.remainingPoints);

const scaled = new RateLimitClient(valkey, { denyCache: new DenyCache({ maxKeys: 1000 }) });
const fixed: Batchable = { algorithm: 'window', limit: 1000, period: '1s' };
const batcher = new TokenBatcher(scaled, 'rl:global', fixed, { targetMs: 200, refundMarginMs: 50 });
const split = new SplitLimit(scaled, 'rl:global', { algorithm: 'gcra', burst: 100, rate: 1000, period: '1s' }, 6);
export async function scale(): Promise<boolean> {
  const a: RateLimitResult = await batcher.acquire(2);
  const b: RateLimitResult = await split.hit();
  const calls: number = batcher.stats.serverCalls;
  await batcher.close();
  return a.local && b.allowed && calls >= 0;
}
// @ts-expect-error a sliding log cannot be batched
new TokenBatcher(scaled, 'k', { algorithm: 'slidinglog', limit: 10, period: '1s' });
