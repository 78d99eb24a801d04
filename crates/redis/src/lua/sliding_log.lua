-- Sliding-window log, kept in chunks: sorted sets of at most 128 entries each, small
-- enough to stay in Redis's compact listpack encoding (zset-max-listpack-entries, 128 by
-- default), about 15 bytes per entry instead of about 100 in one large sorted set (crate docs).
--
-- KEYS[1]  the bucket's log: chunk number k is the sorted set KEYS[1]..':'..k, in the same
--          Cluster slot (the hash tag is in KEYS[1]). Entries are scored by their time (us);
--          a member is the entry's index in its chunk (0 to 127), with ':cost' appended when
--          the cost is not 1 (a weighted cost stored exactly in one entry).
-- KEYS[2]  the meta hash:
--            n   entries logged; entry i goes to chunk floor(i / 128) as member i % 128
--            u   units in the log
--            t   time of the newest entry, also the floor of the clock (below)
--            h   the head chunk, the oldest that may hold entries in the window
--            hu  hc  units in the head chunk and the time of its newest entry, while h is
--                    not the tail (the tail's are tu and t)
--            tu  units in the tail chunk, the one entries are added to
--            k   for every chunk h < k < tail: 'units time' of that closed chunk
-- ARGV[1]  limit   ARGV[2] window (us)   ARGV[3] cost
-- Returns  {allowed, retry_after_us (-1: never), remaining, granted}
-- An entry at time t counts for requests in [t, t + window).
--
-- Each call touches the head chunk (to expire what left the window) and the tail chunk (to
-- log), and drops whole chunks from the head by their known contents, without reading them:
-- O(1) chunks per call, amortized.
local base = KEYS[1]
local meta = KEYS[2]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local CHUNK = 128

-- Exact decimal text of an integer (Lua's own tostring keeps 14 digits, times have 16).
-- Numbers passed to redis.call are sent exactly by Redis itself.
local function int(x)
  return string.format('%d', x)
end

local function chunk(k)
  return base .. ':' .. k -- chunk numbers stay far below 10^14
end

local function cost_of(member)
  return tonumber(string.match(member, ':(%d+)$')) or 1
end

-- The units and newest time of closed chunk k, from its meta field.
local function closed(k)
  local units, time = string.match(redis.call('HGET', meta, k) or '', '^(%d+) (%d+)$')
  -- A missing field (never the case as this script writes the meta) reads as an empty chunk
  -- that left the window; the units it had stay counted in u, so the log only refuses more
  -- until all of it has left the window and it starts afresh.
  return tonumber(units) or 0, tonumber(time) or 0
end

local clock = redis.call('TIME') -- W2
local real = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local m = redis.call('HMGET', meta, 'n', 'u', 't', 'h', 'hu', 'hc', 'tu')
local n, u, t, h = tonumber(m[1]), tonumber(m[2]), tonumber(m[3]), tonumber(m[4])
local hu, hc, tu = tonumber(m[5]) or 0, tonumber(m[6]) or 0, tonumber(m[7]) or 0

-- The log is time-ordered across chunks only if time never goes back: when Redis's clock
-- steps back, decide at the newest logged time until the clock catches up.
local now = real
if t ~= nil and t > now then
  now = t
end
local cutoff = now - window
local dirty = false -- u or tu changed
local head_moved = false -- h, hu or hc changed

if n == nil or u == nil or t == nil or h == nil or t <= cutoff then
  -- No log, or every entry has left the window: start a new log at chunk 0. Chunks of an
  -- old log expire by their TTL; one still there is cleared when it is opened again below.
  if m[1] or m[2] then
    redis.call('DEL', meta)
  end
  n, u, t, h, hu, hc, tu = 0, 0, 0, 0, 0, 0, 0
  head_moved = true
end

local tail = math.floor((n - 1) / CHUNK) -- -1 while nothing was logged

-- Whole chunks that left the window go from the head by their known units.
while h < tail and hc <= cutoff do
  redis.call('DEL', chunk(h))
  u = u - hu
  h = h + 1
  if h < tail then
    hu, hc = closed(h)
    redis.call('HDEL', meta, h)
  end
  dirty, head_moved = true, true
end
-- Then the entries of the head chunk that left the window.
if u > 0 and h <= tail then
  local head = chunk(h)
  local old = redis.call('ZRANGEBYSCORE', head, '-inf', cutoff)
  if #old > 0 then
    local units = 0
    for _, member in ipairs(old) do
      units = units + cost_of(member)
    end
    redis.call('ZREMRANGEBYSCORE', head, '-inf', cutoff)
    u = u - units
    if h < tail then
      hu = hu - units
      head_moved = true
    else
      tu = tu - units
    end
    dirty = true
  end
end

-- Writes the fields that changed: u and tu, n and t after an admission, the head's when it
-- moved, and a closed tail chunk's ('k', 'units time').
local function save(admitted, closing)
  if not admitted then
    if head_moved then
      redis.call('HSET', meta, 'u', u, 'tu', tu, 'h', h, 'hu', hu, 'hc', hc)
    else
      redis.call('HSET', meta, 'u', u, 'tu', tu)
    end
  elseif closing then
    redis.call('HSET', meta, 'u', u, 'tu', tu, 'n', n, 't', t, 'h', h, 'hu', hu, 'hc', hc,
      closing[1], closing[2])
  elseif head_moved then
    redis.call('HSET', meta, 'u', u, 'tu', tu, 'n', n, 't', t, 'h', h, 'hu', hu, 'hc', hc)
  else
    redis.call('HSET', meta, 'u', u, 'tu', tu, 'n', n, 't', t)
  end
end

if cost > limit then
  if dirty then
    save(false, nil)
  end
  return { 0, -1, limit - u, 0 }
end

if u + cost <= limit then
  if cost == 0 then
    if dirty then
      save(false, nil)
    end
    return { 1, 0, limit - u, 0 }
  end
  local index = n % CHUNK
  local k = (n - index) / CHUNK
  local closing = nil
  if index == 0 then
    -- Chunk k opens and the tail before it (if any) closes.
    if n > 0 then
      if tail == h then
        hu, hc = tu, t
        head_moved = true
      else
        closing = { tail, int(tu) .. ' ' .. int(t) }
      end
    end
    tu = 0
    -- A new chunk starts empty: clear what an old log (one whose meta was lost) left there.
    if redis.call('ZCARD', chunk(k)) > 0 then
      redis.call('DEL', chunk(k))
    end
  end
  local member = index
  if cost ~= 1 then
    member = index .. ':' .. int(cost)
  end
  local key = chunk(k)
  redis.call('ZADD', key, now, member)
  n, u, t, tu = n + 1, u + cost, now, tu + cost
  save(true, closing)
  -- Idle keys clean themselves once their newest entry has left the window (in the clamped
  -- time, so a clock that stepped back cannot expire entries still in the window).
  local ttl = math.ceil((now - real + window) / 1000) + 1
  redis.call('PEXPIRE', key, ttl)
  redis.call('PEXPIRE', meta, ttl)
  return { 1, 0, limit - u, cost }
end

-- W4: the request fits once enough of the oldest entries have left the window. Chunks whose
-- known units are not enough are skipped unread; the chunk where enough have left is read.
if dirty then
  save(false, nil)
end
local function wait(at)
  return { 0, math.max(at + window - now, 0), limit - u, 0 }
end
local need = u + cost - limit
local freed = 0
for k = h, tail do
  local units, newest
  if k == tail then
    units, newest = tu, t
  elseif k == h then
    units, newest = hu, hc
  else
    units, newest = closed(k)
  end
  if freed + units >= need then
    -- Every entry holds at least one unit: the one that frees enough is among the first
    -- need - freed.
    local last = math.min(need - freed, CHUNK) - 1
    local entries = redis.call('ZRANGE', chunk(k), 0, last, 'WITHSCORES')
    for i = 1, #entries, 2 do
      freed = freed + cost_of(entries[i])
      if freed >= need then
        return wait(tonumber(entries[i + 1]))
      end
    end
    -- The chunk lost entries (evicted): all of its units leave with its newest entry.
    return wait(newest)
  end
  freed = freed + units
end
-- Unreachable while u matches the log; everything leaves with the newest entry.
return wait(t)
