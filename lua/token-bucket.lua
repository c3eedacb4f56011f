-- token-bucket.lua: token bucket of capacity `burst`, refilled with `limit` tokens per window.
-- KEYS: none of its own (library; the caller passes the check's key).  ARGV: none of its own.
-- Returns: nothing; registers ALGORITHMS[2].
-- State: HASH { tk = tokens in units (1 token = w units), ts = µs of the last update }.
-- A missing key is a full bucket; the TTL is the time to refill completely.

local function tb_read (key, p, now)
  local w, l = scale(p)
  local cap = p.burst * w
  local stk, sts = hash_get(key, 'tk', 'ts')
  local tokens, ts = tonumber(stk), tonumber(sts)
  if not tokens or not ts then tokens, ts = cap, now end
  if tokens > cap then tokens = cap end
  if now > ts then
    local gap = cap - tokens
    -- Compare in µs before multiplying so a long idle time never overflows 2^53.
    if gap > 0 then
      if now - ts >= ceil(gap / l) then tokens = cap else tokens = tokens + (now - ts) * l end
    end
    ts = now
  end
  -- ts > now only if the clock stepped back: no refill until it catches up (never over-admit).
  return w, l, cap, tokens, ts, ts - now
end

local function tb_check (key, p, now, r)
  local w, l, cap, tokens, ts, lead = tb_read(key, p, now)
  local remaining = floor(tokens / w)
  local reset = lead + ceil((cap - tokens) / l)
  if p.cost > p.burst then return outcome(r, false, remaining, -1, reset, 0) end
  local need = p.cost * w
  if tokens < need then return outcome(r, false, remaining, lead + ceil((need - tokens) / l), reset, 0) end
  local left = tokens - need
  outcome(r, true, floor(left / w), 0, lead + ceil((cap - left) / l), 0)
  r.tokens, r.ts = left, ts
  return r
end

-- receipt = the µs at which the bucket is full again after this request (rounded down, so a
-- refund can only return less than was taken).
local function tb_commit (key, p, now, r)
  local w, l = scale(p)
  hash_set(key, r.reset, 'tk', r.tokens, 'ts', r.ts)
  return r.ts + floor((p.burst * w - r.tokens) / l)
end

local function tb_refund (key, p, now, receipt)
  if redis.call('EXISTS', key) == 0 then return end
  local w, l, cap, tokens, ts, lead = tb_read(key, p, now)
  local need = p.cost * w
  -- Tokens of this request not yet refilled by time itself.
  local back = min(need, max(0, receipt - ts) * l)
  tokens = min(cap, tokens + back)
  if tokens >= cap and lead == 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'tk', int(tokens), 'ts', int(ts))
  redis.call('PEXPIRE', key, ttl_ms(lead + ceil((cap - tokens) / l)))
end

-- Takes `p.cost` tokens spent elsewhere (a fallback's debt), down to at most one bucket below
-- empty: the bucket then refills the debt before it admits again.
local function tb_charge (key, p, now)
  local w, l, cap, tokens, ts, lead = tb_read(key, p, now)
  tokens = max(-cap, tokens - p.cost * w)
  redis.call('HSET', key, 'tk', int(tokens), 'ts', int(ts))
  redis.call('PEXPIRE', key, ttl_ms(lead + ceil((cap - tokens) / l)))
end

ALGORITHMS[2] = { check = tb_check, commit = tb_commit, refund = tb_refund, charge = tb_charge }
