-- The common Lua sliding window counter: two counters in a hash keyed by the
-- window number; ARGV = limit, period_ms. Floats for the weight.
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now / period)
local counts = redis.call('HMGET', KEYS[1], tostring(window), tostring(window - 1))
local current = tonumber(counts[1]) or 0
local previous = tonumber(counts[2]) or 0
local weight = (period - (now % period)) / period
if current + previous * weight + 1 > limit then
  return {0, 0}
end
redis.call('HINCRBY', KEYS[1], tostring(window), 1)
redis.call('HDEL', KEYS[1], tostring(window - 2))
redis.call('PEXPIRE', KEYS[1], period * 2)
return {1, math.floor(limit - current - 1 - previous * weight)}
