-- Token bucket: one hash per bucket, read, refilled and decremented atomically.
--
-- KEYS[1]  the bucket hash: curr_tokens, refill_rate (tokens/s, for operators), last_refill (us)
-- ARGV[1]  capacity (tokens)      ARGV[2] count   ARGV[3] period (us): refill count per period
-- ARGV[4]  cost              ARGV[5] want: tokens to take when they are there (>= cost;
--          more than cost only for hot-key batching)
-- Returns  {allowed, retry_after_us (-1: never), remaining, granted}
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
-- Refill arithmetic is in doubles; this tolerance absorbs their rounding so that a request sent
-- at the reported retry-after fits. It admits at most a billionth of a token too much.
local eps = 1e-9

local t = redis.call('TIME') -- W2: the server's clock, never the callers'
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local state = redis.call('HMGET', key, 'curr_tokens', 'last_refill')
local tokens = tonumber(state[1])
local last = tonumber(state[2])
if tokens == nil or last == nil then
  tokens = capacity
  last = now
end
-- After a failover the new primary's clock may lag the old one: never refill backwards.
if now > last then
  tokens = math.min(capacity, tokens + (now - last) * count / period)
  last = now
end

if cost > capacity then
  return {0, -1, math.floor(tokens + eps), 0}
end

local allowed = 0
local retry = 0
local granted = 0
if tokens + eps >= cost then
  allowed = 1
  granted = cost
  if want > cost then
    granted = math.max(cost, math.min(want, math.floor(tokens + eps)))
  end
  tokens = math.max(0, tokens - granted)
else
  retry = math.ceil((cost - tokens) * period / count)
end

redis.call('HSET', key,
  'curr_tokens', string.format('%.17g', tokens),
  'refill_rate', string.format('%.17g', count * 1000000 / period),
  'last_refill', string.format('%d', last))
-- An idle bucket is full again once it expires, which is exactly what a missing key means.
local full_in_ms = math.ceil((capacity - tokens) * period / count / 1000)
redis.call('PEXPIRE', key, full_in_ms + 1000)
return {allowed, retry, math.floor(tokens + eps), granted}
