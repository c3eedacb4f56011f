-- peek.lua: reads what limit.lua would decide for each check, consuming nothing (the admin API's
-- GET /limits). Called with EVALSHA_RO: Redis refuses any write, so a bug here cannot spend budget.
-- Appended after common.lua and the algorithm files by src/limit/scripts.ts.
--
-- KEYS[i]  the state key of check i. The admin API sends one key per call, so every call is in
--          one hash slot and the script works unchanged on Redis Cluster.
-- ARGV[1]  now override in µs: "0" in production (Redis TIME), positive only in tests.
-- ARGV[2]  unused (kept so ARGV lines up with limit.lua).
-- ARGV[2 + i]  check i as in limit.lua ("code,limit,windowMs,burst,cost,maxDelayMs").
-- Returns: a flat array, three integers per check: remaining (units left now, before a request),
--          resetMs (until the budget is whole again; 0 when it is whole now), retryAfterMs (0 when a request of the check's
--          cost would pass now, -1 never).

local now = read_clock(ARGV[1])
local n = #KEYS
if #ARGV ~= 2 + n then
  return redis.error_reply('ERR peek.lua: expected ' .. (2 + n) .. ' arguments, got ' .. #ARGV)
end
local out = {}
for i = 1, n do
  local p = read_params(ARGV[2 + i])
  local algorithm = p and ALGORITHMS[p.code]
  if not algorithm then
    return redis.error_reply('ERR peek.lua: bad check parameters ' .. tostring(ARGV[2 + i]))
  end
  local r = algorithm.check(KEYS[i], p, now, {})
  local remaining, retry, reset = max(0, r.remaining), 0, ms_up(r.reset)
  if p.code == 8 then
    -- a concurrency cap: its places left (an admitting lease check reports an unbounded
    -- remaining, so that the RateLimit headers describe the tightest rate limit)
    local held = redis.call('ZCOUNT', KEYS[i], '(' .. int(floor(now / 1000)), '+inf')
    remaining = max(0, p.limit - held)
    reset = 0
    if not r.ok then retry = 1000 end
  -- an admitting check's remaining and reset count the request it evaluated: take it back out
  elseif r.ok then
    remaining = r.remaining + p.cost
    if remaining >= p.burst then reset = 0 end
  elseif r.retry < 0 then retry = -1
  else retry = max(1, ms_up(r.retry)) end
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
end
return out
