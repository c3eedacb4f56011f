-- gcra.lua: generic cell rate algorithm (virtual scheduling, ITU-T I.371).
-- KEYS: none of its own (library; the caller passes the check's key).  ARGV: none of its own.
-- Returns: nothing; registers ALGORITHMS[1].
-- State: a STRING holding one integer, the theoretical arrival time (TAT) in µs.
-- The emission interval t = ceil(windowUs / limit) is rounded up to whole µs: exact when limit
-- divides windowUs, otherwise at most 1 µs per token slower than configured (never faster).

local function gcra_interval (p)
  return ceil(p.window_us / p.limit)
end

local function gcra_check (key, p, now, r)
  local t = gcra_interval(p)
  local tau = p.burst * t
  local tat = tonumber(state_get(key)) or now
  if tat < now then tat = now end
  local held = tat - now
  local available = max(0, floor((tau - held) / t))
  if p.cost > p.burst then return outcome(r, false, available, -1, held, 0) end
  local nxt = tat + p.cost * t
  if nxt - now > tau then return outcome(r, false, available, nxt - tau - now, held, 0) end
  outcome(r, true, floor((tau - (nxt - now)) / t), 0, nxt - now, 0)
  r.tat = nxt
  return r
end

local function gcra_commit (key, p, now, r)
  state_set(key, r.tat, r.tat - now)
  return r.tat
end

-- receipt = the TAT this request produced. Only the part of its increment that has not yet
-- elapsed is given back, so a refund arriving late never returns budget already regained.
local function gcra_refund (key, p, now, receipt)
  local tat = tonumber(redis.call('GET', key))
  if not tat then return end
  local back = min(p.cost * gcra_interval(p), max(0, receipt - now))
  if back == 0 then return end
  local nxt = max(tat - back, now)
  if nxt <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, int(nxt), 'PX', ttl_ms(nxt - now))
  end
end

-- Moves the TAT by `p.cost` cells spent elsewhere (a fallback's debt), at most one more burst
-- beyond a full one.
local function gcra_charge (key, p, now)
  local t = gcra_interval(p)
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  local nxt = min(tat + p.cost * t, now + 2 * p.burst * t)
  redis.call('SET', key, int(nxt), 'PX', ttl_ms(nxt - now))
end

ALGORITHMS[1] = { check = gcra_check, commit = gcra_commit, refund = gcra_refund, charge = gcra_charge }
