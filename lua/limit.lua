-- limit.lua: decides every limit check of one request in one atomic call, all or nothing.
-- Appended after common.lua and the algorithm files by src/limit/scripts.ts.
--
-- KEYS[i]  the state key of check i. Keys are distinct; under Redis Cluster one call only gets
--          keys of one hash slot (src/limit/redis-store.ts groups them).
-- ARGV[1]  now override in µs: "0" in production, where the script reads Redis TIME so that
--          every gateway instance shares one clock. A positive value only in tests (parity).
-- ARGV[2]  request id, unique per call: sliding-window-log members are "<id>:<unit>".
-- ARGV[2 + i]  check i as one string of six comma-separated integers:
--          "code,limit,windowMs,burst,cost,maxDelayMs" (code: ALGORITHM_CODES in src/limit/types.ts).
-- Returns an array of integers:
--   { allowed (1 or 0), remaining, retryAfterMs (0 when allowed, -1 = never), resetMs,
--     limitingIndex (0-based; -1 when there are no checks), delayMs, nowMs,
--     receipt_1 .. receipt_n (only when allowed: what refund.lua needs to undo check i),
--     remaining_1 .. remaining_n (every check's budget left: after this request when allowed,
--     before it when rejected; the fallback starts from these while Redis is away) }
-- The deciding check is, when rejected, the rejecting check with the longest wait (first on a
-- tie); when allowed, the check with the least remaining (first on a tie).
--
-- Phase 1 evaluates every check against the current state without writing anything. Only if
-- all of them admit does phase 2 write all of them: a request rejected by one dimension
-- consumes nothing in the others, and rejected requests are never recorded.

local now = read_clock(ARGV[1])
local id = ARGV[2]
local n = #KEYS
if #ARGV ~= 2 + n then
  return redis.error_reply('ERR limit.lua: expected ' .. (2 + n) .. ' arguments, got ' .. #ARGV)
end
local now_ms = floor(now / 1000)
if n == 0 then return { 1, 0, 0, 0, -1, 0, now_ms } end

-- -1 (never) is the longest wait of all.
local function longer (a, b)
  if a < 0 then return b >= 0 end
  return b >= 0 and a > b
end

local params, results = {}, {}
local rejecting, tightest = 0, 0
for i = 1, n do
  local p = read_params(ARGV[2 + i])
  local algorithm = p and ALGORITHMS[p.code]
  if not algorithm then
    return redis.error_reply('ERR limit.lua: bad check parameters ' .. tostring(ARGV[2 + i]))
  end
  local r = algorithm.check(KEYS[i], p, now)
  params[i], results[i] = p, r
  if not r.ok then
    if rejecting == 0 or longer(r.retry, results[rejecting].retry) then rejecting = i end
  elseif tightest == 0 or r.remaining < results[tightest].remaining then
    tightest = i
  end
end

if rejecting > 0 then
  local r = results[rejecting]
  local retry = -1
  if r.retry >= 0 then retry = max(1, ms_up(r.retry)) end
  local denied = { 0, r.remaining, retry, ms_up(r.reset), rejecting - 1, 0, now_ms }
  for i = 1, n do
    -- An admitting check's remaining counts this request, which was not recorded: add it back.
    if results[i].ok then denied[7 + i] = results[i].remaining + params[i].cost else denied[7 + i] = max(0, results[i].remaining) end
  end
  return denied
end

local reply = { 1, results[tightest].remaining, 0, ms_up(results[tightest].reset), tightest - 1, 0, now_ms }
local delay = 0
for i = 1, n do
  reply[7 + i] = ALGORITHMS[params[i].code].commit(KEYS[i], params[i], now, results[i], id)
  delay = max(delay, ms_up(results[i].delay))
end
reply[6] = delay
for i = 1, n do reply[7 + n + i] = max(0, results[i].remaining) end
return reply
