-- Sliding-window counter: the previous fixed window's count, weighted by the share of it still
-- inside the sliding window ending now, plus the current window's count.
--
-- Same semantics as spillway-core's SlidingWindowCounter: a request of `cost` at offset `e` into
-- window k is admitted when prev * (P - e) / P + cur + cost <= limit, where prev and cur are the
-- units admitted in windows k-1 and k and P is the period. Windows are aligned on the epoch.
-- Never more than `limit` per aligned window; an approximation of the sliding log whose error
-- bound is documented on the core type.
-- KEYS[1]  the bucket hash: window (index since the epoch), cur, prev
-- ARGV[1]  limit   ARGV[2] window (us)   ARGV[3] cost
-- Returns  {allowed, retry_after_us (-1: never), remaining, granted}
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME') -- W2
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local index = math.floor(now / period)

local state = redis.call('HMGET', key, 'window', 'cur', 'prev')
local stored = tonumber(state[1])
local cur, prev = 0, 0
if stored ~= nil then
  if stored > index then
    -- After a failover the new primary's clock may lag the old one: decide as of the start of
    -- the newer window rather than forget it.
    index = stored
    now = stored * period
  end
  if stored == index then
    cur = tonumber(state[2]) or 0
    prev = tonumber(state[3]) or 0
  elseif stored == index - 1 then
    prev = tonumber(state[2]) or 0
  end
end
local offset = now - index * period

-- The test in integers, exact while limit x period stays below 2^53 = 9.0e15 (10,000 a day in
-- microseconds is 8.6e14); beyond that only ties can round either way.
local function fits(c, e)
  return prev * (period - e) + (cur + c) * period <= limit * period
end

local function remaining()
  return math.max(0, math.floor(limit - cur - prev * (period - offset) / period))
end

if cost > limit then
  return {0, -1, remaining(), 0}
end

if not fits(cost, offset) then
  -- W4: the earliest wait after which the estimate admits `cost` if nothing else arrives. Later
  -- in this window, once prev has faded enough: prev * (P - e) <= (limit - cur - cost) * P.
  if cur + cost <= limit and prev > 0 then
    local x = math.floor((limit - cur - cost) * period / prev)
    local e = period - x
    if e < period then
      return {0, e - offset, remaining(), 0}
    end
  end
  -- Else in the next window, where this window's count is the one fading.
  local e = 0
  if cur > 0 then
    local x = math.floor((limit - cost) * period / cur)
    if x < period then
      e = period - x
    end
  end
  return {0, period - offset + e, remaining(), 0}
end

cur = cur + cost
redis.call('HSET', key, 'window', string.format('%d', index),
  'cur', string.format('%d', cur), 'prev', string.format('%d', prev))
-- The count is still needed through the next window, as that window's `prev`.
redis.call('PEXPIRE', key, math.ceil((2 * period - offset) / 1000) + 1)
return {1, 0, remaining(), cost}
