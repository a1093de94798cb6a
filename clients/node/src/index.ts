export { RateLimitClient, LeaseDeniedError, recommendedOptions } from './client.js';
export type { ValkeyLike, ClientOptions, AllEntry, CellResult } from './client.js';
export { RateLimitResult, AllResult } from './result.js';
export type { RateLimitHeaders, HeaderOptions } from './result.js';
export type { Duration, Limiter, TokenBucket, Window, SlidingLog, Gcra, PolicyRef, CallOptions } from './limiters.js';
export { sameSlot, limitSize } from './limiters.js';
export { DenyCache } from './denyCache.js';
export type { DenyCacheOptions, DenyQuery, Sent } from './denyCache.js';
export { TokenBatcher, BatchStats } from './batching.js';
export type { Batchable, TokenBatcherOptions } from './batching.js';
export { SplitLimit, shares, splitLimit, shardKeys, keySlot } from './split.js';
export type { SplitLimitOptions } from './split.js';
export {
  RateLimitError, RateLimitServerError, RateLimitUnavailableError, RateLimitTimeoutError, RateLimitReplyError, isUnavailable,
} from './errors.js';
export { ValkeyStore } from './express.js';
export type { ValkeyStoreOptions } from './express.js';
export { RateLimiterValkey, RateLimiterRes, RateLimiterUnion, RateLimiterQueue, RateLimiterQueueError } from './flexible.js';
export type { RateLimiterValkeyOptions } from './flexible.js';
