-- The common Lua sliding log on a sorted set: ARGV = limit, period_ms.
-- Members must be unique: time plus a counter held in the key's own hash tag.
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
local count = redis.call('ZCARD', KEYS[1])
if count >= limit then
  return {0, 0}
end
redis.call('ZADD', KEYS[1], now, t[1] .. t[2] .. '-' .. count)
redis.call('PEXPIRE', KEYS[1], period)
return {1, limit - count - 1}
