-- limit.lua: decides every limit check of one request in one atomic call, all or nothing.
-- Appended after common.lua, the algorithm files and decide.lua by src/limit/scripts.ts.
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
-- The decision itself is decide_request in decide.lua (shared with limit-batch.lua).

local now = read_clock(ARGV[1])
local id = ARGV[2]
local n = #KEYS
if #ARGV ~= 2 + n then
  return redis.error_reply('ERR limit.lua: expected ' .. (2 + n) .. ' arguments, got ' .. #ARGV)
end
local reply, problem = decide_request(KEYS, 0, ARGV, 2, n, id, now, true)
if not reply then return redis.error_reply('ERR limit.lua: ' .. problem) end
return reply
