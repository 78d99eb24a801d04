-- Fixed window: at most `limit` units per window, windows aligned on the Unix epoch.
--
-- KEYS[1]  the bucket hash: window (index since the epoch), used (units in that window)
-- ARGV[1]  limit   ARGV[2] window (us)   ARGV[3] cost
-- Returns  {allowed, retry_after_us (-1: never), remaining, granted}
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME') -- W2
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local index = math.floor(now / window)
local ends = (index + 1) * window

local state = redis.call('HMGET', key, 'window', 'used')
local used = 0
if tonumber(state[1]) == index then
  used = tonumber(state[2]) or 0
end

if cost > limit then
  return {0, -1, limit - used, 0}
end
if used + cost > limit then
  return {0, ends - now, limit - used, 0}
end

used = used + cost
redis.call('HSET', key, 'window', string.format('%d', index), 'used', string.format('%d', used))
redis.call('PEXPIRE', key, math.ceil((ends - now) / 1000) + 1)
return {1, 0, limit - used, cost}
