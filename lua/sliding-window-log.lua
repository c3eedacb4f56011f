-- sliding-window-log.lua: exact sliding window; one ZSET entry per admitted cost unit.
-- KEYS: none of its own (library; the caller passes the check's key).  ARGV: none of its own.
-- Returns: nothing; registers ALGORITHMS[4].
-- State: ZSET, score = admission time in µs, member = "<request id>:<unit>" (1..cost).
-- Members are unique per request and unit, never timestamps: same-µs requests never collapse.
-- The window is (now - windowUs, now]; only admitted requests are recorded, so a client that
-- keeps retrying is admitted again as soon as old entries leave the window.

-- The strings a log's commands take at `now`, made once per limit and script call (a call has
-- one now; p is parsed once per call): since = the trim's bound (now - window), from = ZCOUNT's
-- exclusive lower bound, score = an entry's score, ttl = PEXPIRE's argument. A batch would
-- otherwise format them again for every request.
local function swl_strings (p, now)
  if p.swl_now ~= now then
    local since = int(now - p.window_us)
    p.swl_now, p.swl_since, p.swl_from, p.swl_score, p.swl_ttl = now, since, '(' .. since, int(now), ttl_ms(p.window_us)
  end
  return p
end

local function swl_count (key, p, now)
  return redis.call('ZCOUNT', key, swl_strings(p, now).swl_from, '+inf')
end

-- A request's member for cost unit u (no number formatted for the usual cost of 1).
local function swl_member (id, u)
  if u == 1 then return id .. ':1' end
  return id .. ':' .. u
end

-- The batch's cache of a log (common.lua, zset_write) when it counts for this window. One key
-- under two windows is never made by the gateway (a key's limit id names its window), but a
-- cache counts for one window only: a mismatched one is written out and dropped, so the log is
-- read again from Redis and nothing admitted under the other window is missed.
local function swl_cache (key, window_us, now)
  local e = batch_keys and batch_keys[key]
  if not (e and e.z) then return nil end
  if e.window_us == window_us then return e end
  zset_write(key, e)
  batch_keys[key] = nil
  return nil
end

local function swl_check (key, p, now, r)
  local e = swl_cache(key, p.window_us, now)
  local count
  if e then
    count = e.count
  else
    count = swl_count(key, p, now)
    -- in a batch, the log's count is kept from here on
    if batch_keys and batch_keys[key] == nil then
      local q = swl_strings(p, now)
      e = { z = true, window_us = p.window_us, count = count, pending = false, ttl = q.swl_ttl, since = q.swl_since }
      batch_keys[key] = e
    end
  end
  if p.cost <= p.limit and count + p.cost <= p.limit then
    return outcome(r, true, p.limit - count - p.cost, 0, p.window_us, 0)
  end
  -- the reads below look at the log itself: what this batch admitted must be in it
  if e then zset_write(key, e) end
  local remaining = max(0, p.limit - count)
  local reset = 0
  if count > 0 then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset = tonumber(newest[2]) + p.window_us - now
  end
  if p.cost > p.limit then return outcome(r, false, remaining, -1, reset, 0) end
  -- The request fits once the k oldest entries in the window have left it. Entries older than
  -- the window (not trimmed yet) rank before them.
  local k = count + p.cost - p.limit
  local rank = redis.call('ZCARD', key) - count + k - 1
  local entry = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  return outcome(r, false, remaining, tonumber(entry[2]) + p.window_us - now, reset, 0)
end

-- ZADD/ZREM in chunks: unpack() of a very large table would overflow the Lua C stack.
local function swl_each_chunk (id, cost, per_unit, flush)
  local args = {}
  for u = 1, cost do
    per_unit(args, swl_member(id, u))
    if #args >= 512 then
      flush(args)
      args = {}
    end
  end
  if #args > 0 then flush(args) end
end

local function swl_commit (key, p, now, r, id)
  local e = swl_cache(key, p.window_us, now)
  local q = swl_strings(p, now)
  local score = q.swl_score
  if e then
    local pending = e.pending or {}
    local n = #pending
    for u = 1, p.cost do
      pending[n + 1], pending[n + 2] = score, swl_member(id, u)
      n = n + 2
    end
    e.pending, e.count = pending, e.count + p.cost
    return 0
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', q.swl_since)
  swl_each_chunk(id, p.cost,
    function (args, member) args[#args + 1] = score; args[#args + 1] = member end,
    function (args) redis.call('ZADD', key, unpack(args)) end)
  redis.call('PEXPIRE', key, q.swl_ttl)
  return 0
end

-- Removes exactly this request's members; an empty ZSET disappears by itself.
local function swl_refund (key, p, now, receipt, id)
  swl_each_chunk(id, p.cost,
    function (args, member) args[#args + 1] = member end,
    function (args) redis.call('ZREM', key, unpack(args)) end)
end

-- Records `p.cost` units admitted elsewhere (a fallback's debt), even beyond the limit (at most
-- one more window's worth, so a runaway debt cannot grow the log without bound).
local function swl_charge (key, p, now, id)
  local count = swl_count(key, p, now)
  local units = min(p.cost, max(0, 2 * p.limit - count))
  if units == 0 then return end
  swl_commit(key, { window_us = p.window_us, cost = units }, now, nil, id)
end

ALGORITHMS[4] = { check = swl_check, commit = swl_commit, refund = swl_refund, charge = swl_charge }
