-- The common Lua fixed window: KEYS[1] (the caller appends the window number);
-- ARGV = limit, period_seconds.
local count = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2], 'NX')
if count > tonumber(ARGV[1]) then
  return {0, 0}
end
return {1, tonumber(ARGV[1]) - count}
