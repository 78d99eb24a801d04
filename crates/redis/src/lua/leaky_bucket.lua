-- Leaky bucket: a queue drained at the rate, for backends that need an even flow.
--
-- Same semantics as spillway-core's LeakyBucket: a request is admitted when the backlog in front
-- of it drains within `burst` emission intervals, and then adds `cost` intervals of work.
-- KEYS[1]  the bucket hash: tat (us, the time the queue will be empty), interval_us
-- ARGV[1]  interval (us per unit, may be fractional)   ARGV[2] burst (intervals)   ARGV[3] cost
-- Returns  {allowed, retry_after_us, remaining, granted}
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME') -- W2
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local tat = tonumber(redis.call('HGET', key, 'tat')) or now
local backlog = math.max(0, tat - now)
local tolerance = burst * interval

-- Units that fit now: k requests of cost 1 fit while backlog + (k - 1) * interval <= tolerance.
local function fits(b)
  if b > tolerance then
    return 0
  end
  return math.floor((tolerance - b) / interval) + 1
end

if cost > 0 and backlog > tolerance then
  return {0, math.ceil(backlog - tolerance), 0, 0}
end

tat = math.max(tat, now) + cost * interval
redis.call('HSET', key, 'tat', string.format('%.17g', tat),
  'interval_us', string.format('%.17g', interval))
redis.call('PEXPIRE', key, math.ceil((tat - now) / 1000) + 1000)
return {1, 0, fits(tat - now), cost}
