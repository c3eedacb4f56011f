-- fixed-window.lua: counter per fixed window; windows are aligned to the Unix epoch (the same
-- boundaries for every key and every gateway instance).
-- KEYS: none of its own (library; the caller passes the check's key).  ARGV: none of its own.
-- Returns: nothing; registers ALGORITHMS[6].
-- State: HASH { w = window index floor(now / windowUs), c = count admitted in it }.
-- The window index is stored rather than trusting the key to expire on the boundary: the TTL
-- only reclaims memory, decisions never depend on when Redis expires the key.

local function fw_read (key, p, now)
  local k = floor(now / p.window_us)
  local sw, sc = hash_get(key, 'w', 'c')
  local cur = 0
  sw = tonumber(sw)
  -- A stored window ahead of now means the clock stepped back (failover to a skewed replica, an
  -- NTP step): keep counting in that later window rather than overwrite it with an empty one.
  if sw and sw > k then k = sw end
  if sw == k then cur = tonumber(sc) or 0 end
  return k, cur, (k + 1) * p.window_us - now
end

local function fw_check (key, p, now, r)
  local k, cur, to_end = fw_read(key, p, now)
  return counter_check(r, p, k, cur, to_end)
end

-- receipt = the window index the request was counted in.
local function fw_commit (key, p, now, r)
  hash_set(key, r.reset, 'w', r.k, 'c', r.cur)
  return r.k
end

local function fw_refund (key, p, now, receipt)
  local s = redis.call('HMGET', key, 'w', 'c')
  if tonumber(s[1]) == receipt then
    redis.call('HSET', key, 'c', int(max(0, (tonumber(s[2]) or 0) - p.cost)))
  end
end

-- Records `p.cost` units admitted elsewhere (a fallback's debt), even beyond the limit.
local function fw_charge (key, p, now)
  local k, cur, to_end = fw_read(key, p, now)
  redis.call('HSET', key, 'w', int(k), 'c', int(min(cur + p.cost, 2 * p.limit)))
  redis.call('PEXPIRE', key, ttl_ms(to_end))
end

ALGORITHMS[6] = { check = fw_check, commit = fw_commit, refund = fw_refund, charge = fw_charge }
