-- common.lua: helpers shared by limit.lua, limit-batch.lua, refund.lua, peek.lua and charge.lua.
-- src/limit/scripts.ts concatenates common.lua, the algorithm files and decide.lua, then one entry
-- file, into one script, so everything here is a chunk-level local (made again on every EVALSHA);
-- or, for FCALL, all the entry files as functions of one library, whose locals live from call to
-- call (begin_call, at the end). The algorithm files become the branches of load_algorithm (see
-- below).
-- KEYS: none of its own.  ARGV: none of its own.  Returns: nothing (library).
--
-- Numbers: Redis Lua numbers are IEEE doubles. Every value kept here is an integer below 2^52
-- (validateLimitSpec in src/limit/algorithms/index.ts bounds the products), so +, -, * and
-- floor(a / b) are exact. The TypeScript twins in src/limit/algorithms/ do the same operations
-- in the same order, which is what the parity test checks.
--
-- Every algorithm file registers ALGORITHMS[code] = { check, commit, refund } with
--   check(key, p, now, r)          -> outcome r (filled in): reads state, never writes
--   commit(key, p, now, r, id)     -> receipt (integer): writes the admission evaluated by check
--   refund(key, p, now, receipt, id): undoes a commit whose request was rejected elsewhere
-- where p = read_params(...), now is in µs and every time in an outcome is in µs.

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

-- Added to every TTL when the clock is overridden (tests only): virtual time does not move
-- Redis's expiry clock, so a TTL computed from virtual time could drop state a test still needs.
local ttl_slack_ms = 0

-- An algorithm's functions are made the first time a call names its code. Redis runs a script's
-- whole chunk on every call, and built eagerly the eight algorithm files cost every call their
-- functions and tables, mostly for algorithms it never uses. scripts.ts writes load_algorithm(code)
-- right after this file: one function whose branch for each code is that algorithm's file, which
-- registers ALGORITHMS[code] as before. One function, not one per file: a closure captures every
-- helper its file uses, each capture a walk of Lua's list of open upvalues, and eight such
-- closures cost each call 22k Redis instructions against about 5k for the one. One limit.lua call
-- for one gcra check counts 200.7k Redis instructions eager, 138.7k this way (bench/README.md,
-- twenty-second session).
local load_algorithm
local ALGORITHMS = setmetatable({}, {
  __index = function (algorithms, code)
    load_algorithm(code)
    return rawget(algorithms, code)
  end
})

local function read_clock (override)
  local o = tonumber(override) or 0
  if o > 0 then
    ttl_slack_ms = 600000
    return o
  end
  -- One clock for every gateway instance. Redis >= 5 replicates a script's effects, not the
  -- script, so reading TIME here is safe (7.0+ always does).
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Numbers are handed to Redis as '%d' strings: a double would otherwise be formatted
-- by Redis (possibly with an exponent), and PEXPIRE/SET PX only take integers.
local function int (x)
  return string.format('%d', x)
end

-- µs to ms rounded up: a wait of 0.5 ms is 1 ms, never 0.
local function ms_up (us)
  if us <= 0 then return 0 end
  return ceil(us / 1000)
end

-- A TTL of at least 1 ms covering `us`: state lives exactly as long as it matters.
local function ttl_ms (us)
  return int(max(1, ms_up(us)) + ttl_slack_ms)
end

-- The string and hash state of the algorithms, read and written through these helpers. Outside a
-- batch they are plain GET / SET PX / HMGET / HSET + PEXPIRE. Inside one (limit-batch.lua sets
-- batch_keys to a table) every key is read from Redis once, then kept here, and every key written
-- is written once, by flush_batch_keys at the end of the batch: the global and api keys that every
-- request of a batch shares cost one read and one write per batch, not per request. The result
-- is the state one call per request would leave (the batch parity test compares both).
-- Values are written as numbers and TTLs given in µs: a batch keeps them as numbers and turns
-- them into Redis's strings once per key at the end, not once per request ('%d' goes through
-- sprintf, the largest single cost of the script's own work after the VM).
local batch_keys = nil

-- The entry of a string key: { v = its value (a string read from Redis, a number written, false
-- when absent), ttl = µs, dirty = written }.
local function state_get (key)
  if not batch_keys then return redis.call('GET', key) end
  local e = batch_keys[key]
  if e == nil then
    e = { v = redis.call('GET', key), ttl = 0, dirty = false }
    batch_keys[key] = e
  end
  return e.v
end

-- SET key value PX ttl, the value an integer and the TTL in µs (at least 1 ms).
local function state_set (key, value, ttl_us)
  if not batch_keys then
    redis.call('SET', key, int(value), 'PX', ttl_ms(ttl_us))
    return
  end
  local e = batch_keys[key]
  if e == nil then
    batch_keys[key] = { v = value, ttl = ttl_us, dirty = true }
  else
    e.v, e.ttl, e.dirty = value, ttl_us, true
  end
end

-- HMGET key f1 f2 [f3]: Redis's reply.
local function hmget (key, f1, f2, f3)
  if f3 then return redis.call('HMGET', key, f1, f2, f3) end
  return redis.call('HMGET', key, f1, f2)
end

-- HMGET key f1 f2 [f3]: the values, false for an absent field.
-- The entry of a hash key: { h = field -> value (a string read, a number written, false when
-- absent), ttl = µs, dirty = written }. Every field of a key's algorithm is read before it is
-- written, so a field of h is either as Redis holds it or newer.
local function hash_get (key, f1, f2, f3)
  if not batch_keys then
    local s = hmget(key, f1, f2, f3)
    return s[1], s[2], s[3]
  end
  local e = batch_keys[key]
  if e == nil then
    -- first read in the batch: the entry is made with its fields (a table built field by field
    -- from empty is resized at each one)
    local s = hmget(key, f1, f2, f3)
    local h = { [f1] = s[1], [f2] = s[2] }
    if f3 then h[f3] = s[3] end
    batch_keys[key] = { h = h, ttl = 0, dirty = false }
    return s[1], s[2], s[3]
  end
  local h = e.h
  if h[f1] == nil or h[f2] == nil or (f3 and h[f3] == nil) then
    local s = hmget(key, f1, f2, f3)
    -- a field written earlier in the batch is newer than what Redis holds
    if h[f1] == nil then h[f1] = s[1] end
    if h[f2] == nil then h[f2] = s[2] end
    if f3 and h[f3] == nil then h[f3] = s[3] end
  end
  if f3 then return h[f1], h[f2], h[f3] end
  return h[f1], h[f2]
end

-- HSET key f1 v1 f2 v2 [f3 v3] then PEXPIRE key ttl: integer values, the TTL in µs.
local function hash_set (key, ttl_us, f1, v1, f2, v2, f3, v3)
  if not batch_keys then
    if f3 then
      redis.call('HSET', key, f1, int(v1), f2, int(v2), f3, int(v3))
    else
      redis.call('HSET', key, f1, int(v1), f2, int(v2))
    end
    redis.call('PEXPIRE', key, ttl_ms(ttl_us))
    return
  end
  local e = batch_keys[key]
  if e == nil then
    e = { h = {}, ttl = 0, dirty = false }
    batch_keys[key] = e
  end
  local h = e.h
  h[f1], h[f2] = v1, v2
  if f3 then h[f3] = v3 end
  e.ttl, e.dirty = ttl_us, true
end

-- The sliding-window logs of a batch (sliding-window-log.lua): a log's count in the window is read
-- from Redis once per batch and then kept, and the entries its requests admit are added at the
-- end of the batch with one trim, one ZADD and one PEXPIRE, where one call per request pays four
-- commands each. Every request of a batch has the same now, so one trim at the end removes what
-- each request's own trim would have. A read of the log itself (a rejection's retry time) first
-- writes what is pending, so it sees every entry (zset_write).
-- The entry of a log: { z = true, window_us, count = entries in the window, pending = scores and
-- members to add (false when none), ttl = PEXPIRE's argument, since = the trim's bound }.

-- Writes a log's pending entries: the trim, the ZADDs (in chunks: unpack() of a very large table
-- would overflow the Lua C stack) and the expiry.
local function zset_write (key, e)
  if not e.pending then return end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', e.since)
  local p = e.pending
  for i = 1, #p, 512 do
    redis.call('ZADD', key, unpack(p, i, math.min(i + 511, #p)))
  end
  redis.call('PEXPIRE', key, e.ttl)
  e.pending = false
end

local function flush_batch_keys ()
  for key, e in pairs(batch_keys) do
    if e.z then
      zset_write(key, e)
    elseif e.dirty then
      local h = e.h
      if h then
        local args, n = {}, 0
        for f, v in pairs(h) do
          if v then
            args[n + 1], args[n + 2] = f, int(v)
            n = n + 2
          end
        end
        redis.call('HSET', key, unpack(args, 1, n))
        redis.call('PEXPIRE', key, ttl_ms(e.ttl))
      else
        redis.call('SET', key, int(e.v), 'PX', ttl_ms(e.ttl))
      end
    end
  end
  batch_keys = nil
end

local function gcd (a, b)
  while b ~= 0 do
    a, b = b, a % b
  end
  return a
end

-- Exact bucket arithmetic: one token is `w` units and `l` units refill per µs, so a refill of
-- e µs adds e * l units with no fraction to lose (the seed scripts floored it away).
local function scale (p)
  local w = p.scale_w
  if w then return w, p.scale_l end
  local g = gcd(p.window_us, p.limit)
  p.scale_w, p.scale_l = p.window_us / g, p.limit / g
  return p.scale_w, p.scale_l
end

-- A check's parameters arrive as one argument "code,limit,windowMs,burst,cost,maxDelayMs": the
-- client builds that string once per limit (every part is fixed by the config), which saves it
-- encoding five more arguments per check on every call. nil when the argument is malformed.
-- Parsed once per distinct argument: a batch repeats the same few limits for each of its requests.
-- Under EVALSHA the cache is a local of the script's chunk, so it starts empty on every call; under
-- FCALL the library is kept from call to call (begin_call), and so is the cache, up to
-- PARSED_PARAMS_MAX arguments (a config has a few limits, but a check's cost is part of its
-- argument).
local PARSED_PARAMS_MAX = 1024
local parsed_params, parsed_count = {}, 0
local function read_params (arg)
  local known = parsed_params[arg or '']
  if known then return known end
  local c, l, w, b, k, d = string.match(arg or '', '^(%d+),(%d+),(%d+),(%d+),(%d+),(%d+)$')
  if not c then return nil end
  local p = {
    code = tonumber(c),
    limit = tonumber(l),
    window_ms = tonumber(w),
    burst = tonumber(b),
    cost = tonumber(k),
    max_delay_ms = tonumber(d)
  }
  p.window_us = p.window_ms * 1000
  parsed_params[arg] = p
  parsed_count = parsed_count + 1
  return p
end

-- A check's outcome, written into r (the caller's table, reused from request to request: a batch
-- would otherwise allocate one per check and leave it to the garbage collector) and returned.
-- ok: admitted; remaining: whole cost units left; retry: µs until a retry can pass (-1 never);
-- reset: µs until the budget is whole again; delay: µs to hold an admitted request. An admitting
-- check adds what its commit needs (r.tat, r.k, ...); commit reads only what its check set.
local function outcome (r, ok, remaining, retry, reset, delay)
  r.ok, r.remaining, r.retry, r.reset, r.delay = ok, remaining, retry, reset, delay
  return r
end

-- The check of a counter of one period (fixed-window, calendar-quota): `cur` units were admitted
-- in period `k`, which ends in `to_end` µs. Admits while cur + cost fits the limit; a cost above
-- the limit can never pass (retry -1).
local function counter_check (r, p, k, cur, to_end)
  if p.cost <= p.limit and cur + p.cost <= p.limit then
    outcome(r, true, p.limit - cur - p.cost, 0, to_end, 0)
    r.k, r.cur = k, cur + p.cost
    return r
  end
  local reset = 0
  if cur > 0 then reset = to_end end
  if p.cost > p.limit then return outcome(r, false, max(0, p.limit - cur), -1, reset, 0) end
  return outcome(r, false, max(0, p.limit - cur), to_end, reset, 0)
end

-- Under FCALL (FUNCTION_LIBRARY in src/limit/scripts.ts) the library is made once, by a call's
-- first use, and kept: every entry starts with this. A call's own state starts empty as in a fresh
-- chunk (a batch that failed half-way left batch_keys set; a test's clock override left the TTL
-- slack), while the algorithms and the parsed limits stay made.
local function begin_call ()
  batch_keys, ttl_slack_ms = nil, 0
  if parsed_count >= PARSED_PARAMS_MAX then parsed_params, parsed_count = {}, 0 end
end
