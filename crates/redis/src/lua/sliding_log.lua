-- Sliding-window log (W1-W6): one sorted-set entry per admitted request, scored by its time.
--
-- KEYS[1]  the log: members are a per-bucket sequence number in base 62, with ":cost" appended
--          when the cost is not 1 (so a weighted cost is stored exactly, W3, in one entry)
-- KEYS[2]  its companion hash: seq (last sequence number), sum (units in the log)
-- ARGV[1]  limit   ARGV[2] window (us)   ARGV[3] cost
-- Returns  {allowed, retry_after_us (-1: never), remaining, granted}
-- An entry at time t counts for requests in [t, t + window).
local log = KEYS[1]
local meta = KEYS[2]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local t = redis.call('TIME') -- W2
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cutoff = now - window

-- Members of at most 6 characters fit Redis's smallest string allocation (8 bytes: a 1-byte
-- header, the text and a NUL), which keeps a logged request near 100 bytes (W6); see the crate
-- docs for where the rest goes. The sequence wraps after 62^4 = 14,776,336 requests; a
-- log never holds more than `limit` entries, so members stay unique for any limit below that.
local digits = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
local function base62(n)
  local s = ''
  repeat
    local d = n % 62
    s = string.sub(digits, d + 1, d + 1) .. s
    n = (n - d) / 62
  until n == 0
  return s
end

local function cost_of(member)
  return tonumber(string.match(member, ':(%d+)$')) or 1
end

local function sum_of(members)
  local s = 0
  for _, m in ipairs(members) do
    s = s + cost_of(m)
  end
  return s
end

local sum = tonumber(redis.call('HGET', meta, 'sum'))
if sum == nil then
  -- The companion expired or was lost: rebuild the sum from the log itself.
  sum = sum_of(redis.call('ZRANGE', log, 0, -1))
  sum = sum - sum_of(redis.call('ZRANGEBYSCORE', log, '-inf', cutoff))
else
  local expired = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  sum = sum - sum_of(expired)
end
redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)

if cost > limit then
  return {0, -1, limit - sum, 0}
end

local ttl = math.ceil(window / 1000) + 1
if sum + cost <= limit then
  local seq = redis.call('HINCRBY', meta, 'seq', 1)
  if seq >= 14776336 then
    seq = 0
    redis.call('HSET', meta, 'seq', 0)
  end
  local member = base62(seq)
  if cost ~= 1 then
    member = member .. ':' .. cost
  end
  if cost > 0 then
    redis.call('ZADD', log, now, member)
  end
  sum = sum + cost
  redis.call('HSET', meta, 'sum', string.format('%d', sum))
  redis.call('PEXPIRE', log, ttl)
  redis.call('PEXPIRE', meta, ttl)
  return {1, 0, limit - sum, cost}
end

-- W4: the request fits once enough of the oldest entries have left the window.
local need = sum + cost - limit
local freed = 0
local start = 0
while true do
  local page = redis.call('ZRANGE', log, start, start + 63, 'WITHSCORES')
  if #page == 0 then
    break
  end
  for i = 1, #page, 2 do
    freed = freed + cost_of(page[i])
    if freed >= need then
      redis.call('HSET', meta, 'sum', string.format('%d', sum))
      return {0, tonumber(page[i + 1]) + window - now, limit - sum, 0}
    end
  end
  start = start + 64
end
-- Unreachable while sum matches the log; answer one window rather than never.
return {0, window, limit - sum, 0}
