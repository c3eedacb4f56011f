-- leaky-bucket.lua: leaky bucket of capacity `burst` draining `limit` per window, as a meter
-- (max_delay_ms = 0: reject when full) or as a shaper (max_delay_ms > 0: admit with a delay).
-- KEYS: none of its own (library; the caller passes the check's key).  ARGV: none of its own.
-- Returns: nothing; registers ALGORITHMS[3].
-- State: HASH { wt = water in units (1 request of cost 1 = w units), ts = µs of the last update }.
-- A missing key is an empty bucket; the TTL is the time to drain completely.
--
-- Delay mode is virtual scheduling, like nginx limit_req without nodelay: the water already in
-- the bucket drains at the configured rate, so a new request's slot is when that water is gone.
-- It is admitted with delay = time to that slot, or rejected if the delay would exceed
-- max_delay_ms or the bucket would overflow.

local function lb_read (key, p, now)
  local w, l = scale(p)
  local swt, sts = hash_get(key, 'wt', 'ts')
  local water, ts = tonumber(swt), tonumber(sts)
  if not water or not ts then water, ts = 0, now end
  if now > ts then
    if water > 0 then
      if now - ts >= ceil(water / l) then water = 0 else water = water - (now - ts) * l end
    end
    ts = now
  end
  return w, l, p.burst * w, water, ts, ts - now
end

local function lb_check (key, p, now, r)
  local w, l, cap, water, ts, lead = lb_read(key, p, now)
  local remaining = max(0, floor((cap - water) / w))
  local reset = lead + ceil(water / l)
  if p.cost > p.burst then return outcome(r, false, remaining, -1, reset, 0) end
  local need = p.cost * w
  local max_delay_us = p.max_delay_ms * 1000
  local delay = 0
  -- The largest water level at which this request may enter.
  local target = cap - need
  if max_delay_us > 0 then
    delay = lead + ceil(water / l)
    target = min(target, max_delay_us * l)
  end
  if water > target or delay > max_delay_us then
    return outcome(r, false, remaining, lead + max(0, ceil((water - target) / l)), reset, 0)
  end
  outcome(r, true, floor((cap - water - need) / w), 0, lead + ceil((water + need) / l), delay)
  r.water, r.ts = water + need, ts
  return r
end

-- receipt = the µs at which the bucket is empty after this request (rounded down).
local function lb_commit (key, p, now, r)
  local w, l = scale(p)
  hash_set(key, r.reset, 'wt', r.water, 'ts', r.ts)
  return r.ts + floor(r.water / l)
end

local function lb_refund (key, p, now, receipt)
  if redis.call('EXISTS', key) == 0 then return end
  local w, l, cap, water, ts, lead = lb_read(key, p, now)
  -- Water of this request that has not drained yet.
  local back = min(p.cost * w, max(0, receipt - ts) * l)
  water = max(0, water - back)
  if water == 0 and lead == 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'wt', int(water), 'ts', int(ts))
  redis.call('PEXPIRE', key, ttl_ms(lead + ceil(water / l)))
end

-- Pours `p.cost` units admitted elsewhere (a fallback's debt), up to one bucket above full: the
-- bucket drains the debt before it admits again.
local function lb_charge (key, p, now)
  local w, l, cap, water, ts, lead = lb_read(key, p, now)
  water = min(2 * cap, water + p.cost * w)
  redis.call('HSET', key, 'wt', int(water), 'ts', int(ts))
  redis.call('PEXPIRE', key, ttl_ms(lead + ceil(water / l)))
end

ALGORITHMS[3] = { check = lb_check, commit = lb_commit, refund = lb_refund, charge = lb_charge }
