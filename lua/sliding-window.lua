-- sliding-window.lua: two-window counter (O(1) memory), the approximation Cloudflare describes
-- in "How we built rate limiting capable of scaling to millions of domains" (2017).
-- KEYS: none of its own (library; the caller passes the check's key).  ARGV: none of its own.
-- Returns: nothing; registers ALGORITHMS[5].
-- State: HASH { w = index of the current fixed window (floor(now / windowUs)), c = its count,
--               p = the previous window's count }.
-- Estimate = p * (windowMs - elapsedMs) / windowMs + c, compared as integers (multiplied by
-- windowMs); elapsed is floored to the ms, which can only over-weight p (never over-admit).
-- Error bound (also in src/limit/algorithms/sliding-window.ts): the true number admitted in
-- (now - window, now] is at most limit + p * elapsed / window < 2 * limit; it is exact when the
-- previous window's requests were spread evenly.

local function sw_read (key, p, now)
  local k = floor(now / p.window_us)
  local sw, sc, sp = hash_get(key, 'w', 'c', 'p')
  sw, sc, sp = tonumber(sw), tonumber(sc) or 0, tonumber(sp) or 0
  -- A stored window ahead of now: the clock stepped back. Keep that later window (as at its
  -- very start) instead of overwriting it with an empty one.
  if sw and sw > k then k = sw end
  local elapsed_ms = max(0, floor((now - k * p.window_us) / 1000))
  local cur, prev = 0, 0
  if sw == k then cur, prev = sc, sp elseif sw == k - 1 then prev = sc end
  return k, elapsed_ms, cur, prev
end

local function sw_reset (p, now, k, cur, prev)
  if cur > 0 then return (k + 2) * p.window_us - now end
  if prev > 0 then return (k + 1) * p.window_us - now end
  return 0
end

local function sw_check (key, p, now, r)
  local k, elapsed_ms, cur, prev = sw_read(key, p, now)
  local wm = p.window_ms
  local budget = p.limit * wm - prev * (wm - elapsed_ms)
  if p.cost <= p.limit and (cur + p.cost) * wm <= budget then
    outcome(r, true, max(0, floor((budget - (cur + p.cost) * wm) / wm)), 0,
      sw_reset(p, now, k, cur + p.cost, prev), 0)
    r.k, r.cur, r.prev = k, cur + p.cost, prev
    return r
  end
  local remaining = max(0, floor((budget - cur * wm) / wm))
  local reset = sw_reset(p, now, k, cur, prev)
  if p.cost > p.limit then return outcome(r, false, remaining, -1, reset, 0) end
  local spare = p.limit - cur - p.cost
  local retry
  if spare >= 0 then
    -- Later in this window, once the previous window's weight has shrunk: first ms offset x
    -- with prev * (wm - x) <= spare * wm (prev > 0 here, else the request would fit).
    retry = k * p.window_us + (wm - floor(spare * wm / prev)) * 1000 - now
  else
    -- In the next window, where this window's count becomes the previous one (cur > 0 here).
    retry = (k + 1) * p.window_us + (wm - floor((p.limit - p.cost) * wm / cur)) * 1000 - now
  end
  return outcome(r, false, remaining, retry, reset, 0)
end

-- receipt = the window index the request was counted in.
local function sw_commit (key, p, now, r)
  hash_set(key, (r.k + 2) * p.window_us - now, 'w', r.k, 'c', r.cur, 'p', r.prev)
  return r.k
end

local function sw_refund (key, p, now, receipt)
  local s = redis.call('HMGET', key, 'w', 'c', 'p')
  local sw = tonumber(s[1])
  if sw == receipt then
    redis.call('HSET', key, 'c', int(max(0, (tonumber(s[2]) or 0) - p.cost)))
  elseif sw == receipt + 1 then
    redis.call('HSET', key, 'p', int(max(0, (tonumber(s[3]) or 0) - p.cost)))
  end
end

-- Records `p.cost` units admitted elsewhere (a fallback's debt), even beyond the limit.
local function sw_charge (key, p, now)
  local k, elapsed_ms, cur, prev = sw_read(key, p, now)
  redis.call('HSET', key, 'w', int(k), 'c', int(min(cur + p.cost, 2 * p.limit)), 'p', int(prev))
  redis.call('PEXPIRE', key, ttl_ms((k + 2) * p.window_us - now))
end

ALGORITHMS[5] = { check = sw_check, commit = sw_commit, refund = sw_refund, charge = sw_charge }
