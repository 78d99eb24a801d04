-- GCRA, the generic cell rate algorithm (as redis-cell and governor define it): one number per
-- key, the theoretical arrival time (TAT), at which the bucket would be full again.
--
-- Same semantics as spillway-core's Gcra: charging `cost` moves the TAT `cost` intervals later,
-- and a request is admitted while the TAT, this request included, stays within `burst`
-- intervals of now; a cost above the burst never fits.
-- KEYS[1]  the bucket hash: tat (us since the epoch, whole part), tat_frac (its fraction)
-- ARGV[1]  interval (us per unit, may be fractional)   ARGV[2] burst (units)   ARGV[3] cost
-- Returns  {allowed, retry_after_us (-1: never), remaining, granted}
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
-- A millionth of a microsecond: absorbs the rounding of the fractional interval, so that a
-- request sent at the reported retry-after fits.
local eps = 1e-6

local t = redis.call('TIME') -- W2
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tolerance = burst * interval

-- The TAT is kept as whole microseconds plus a fraction because a double holding an absolute
-- time (about 1.7e15 us) resolves only a quarter of a microsecond; the backlog, a small number,
-- keeps the fraction exactly.
local state = redis.call('HMGET', key, 'tat', 'tat_frac')
local backlog = 0
local whole = tonumber(state[1])
if whole ~= nil then
  backlog = math.max(0, (whole - now) + (tonumber(state[2]) or 0))
end

local function left(b)
  return math.max(0, math.floor((tolerance - b) / interval + 1e-9))
end

if cost > burst then
  return {0, -1, left(backlog), 0}
end
local reach = backlog + cost * interval
if reach > tolerance + eps then
  -- W4: at now + (reach - tolerance) the TAT is exactly within the tolerance.
  return {0, math.ceil(reach - tolerance - eps), left(backlog), 0}
end
if cost > 0 then
  local ahead = math.floor(reach)
  redis.call('HSET', key, 'tat', string.format('%d', now + ahead),
    'tat_frac', string.format('%.17g', reach - ahead))
  -- Once the TAT has passed, a missing key means exactly the same thing: a full bucket.
  redis.call('PEXPIRE', key, math.ceil(reach / 1000) + 1000)
end
return {1, 0, left(reach), cost}
