-- Debit of a token budget: the cost a response reported, taken after the fact whatever the
-- bucket holds, so the bucket may go into debt. Admissions never call Redis for such a bucket:
-- a proxy admits while the last debit it made found the bucket not in debt.
--
-- The bucket is a GCRA meter (the same arithmetic as gcra.lua): one theoretical arrival time
-- (TAT), `cost` intervals later per unit debited; a TAT more than `burst` intervals ahead of
-- now is debt, paid back by the passing of time.
-- KEYS[1]  the bucket hash: tat (us since the epoch, whole part), tat_frac (its fraction)
-- ARGV[1]  interval (us per unit, may be fractional)   ARGV[2] burst (units)   ARGV[3] cost
-- Returns  {owed_us: until one unit has room again (0: not in debt), remaining units}
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local eps = 1e-6

local t = redis.call('TIME') -- the server's clock, never the callers'
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tolerance = burst * interval

local state = redis.call('HMGET', key, 'tat', 'tat_frac')
local backlog = 0
local whole = tonumber(state[1])
if whole ~= nil then
  backlog = math.max(0, (whole - now) + (tonumber(state[2]) or 0))
end
backlog = backlog + cost * interval
if cost > 0 then
  local ahead = math.floor(backlog)
  redis.call('HSET', key, 'tat', string.format('%d', now + ahead),
    'tat_frac', string.format('%.17g', backlog - ahead))
  redis.call('PEXPIRE', key, math.ceil(backlog / 1000) + 1000)
end
local reach = backlog + interval
local owed = 0
if reach > tolerance + eps then
  owed = math.ceil(reach - tolerance - eps)
end
local left = math.max(0, math.floor((tolerance - backlog) / interval + 1e-9))
return {owed, left}
