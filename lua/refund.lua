-- refund.lua: undoes the admission limit.lua recorded for checks whose request was rejected by
-- another call (Redis Cluster: checks in other hash slots are decided by separate calls).
-- Appended after common.lua and the algorithm files by src/limit/scripts.ts.
--
-- KEYS[i]  the state key of check i (one hash slot per call), i = 1..n,
-- KEYS[n + 1]  a marker key in the same slot, unique to this refund: should the same refund arrive
--          twice (ioredis Cluster re-sends a command whose connection closed before the reply
--          unless retryDelayOnFailover is 0, as the gateway sets it), the second is a no-op.
-- ARGV[1]  now override in µs: "0" in production (Redis TIME), positive only in tests.
-- ARGV[2]  the request id passed to limit.lua for the admission being undone.
-- ARGV[3 + 2 * (i - 1)]  check i's parameter string as in limit.lua ("code,limit,windowMs,burst,cost,maxDelayMs"),
-- ARGV[4 + 2 * (i - 1)]  then receipt_i from limit.lua's reply.
-- Returns: the number of checks processed.
--
-- Each refund gives back at most what the request took, and only the part that time has not
-- already given back, so a late refund never over-admits. Idempotent through KEYS[n + 1].
-- Returns 0 (nothing done) when the marker shows the refund already ran.

local now = read_clock(ARGV[1])
local id = ARGV[2]
local n = #KEYS - 1
if n < 0 or #ARGV ~= 2 + 2 * n then
  return redis.error_reply('ERR refund.lua: expected ' .. (2 + 2 * n) .. ' arguments, got ' .. #ARGV)
end
-- Kept a minute: far longer than any re-send, and it expires by itself.
if not redis.call('SET', KEYS[n + 1], '1', 'NX', 'PX', 60000) then return 0 end
for i = 1, n do
  local base = 3 + 2 * (i - 1)
  local p = read_params(ARGV[base])
  local algorithm = p and ALGORITHMS[p.code]
  if not algorithm then
    return redis.error_reply('ERR refund.lua: bad check parameters ' .. tostring(ARGV[base]))
  end
  algorithm.refund(KEYS[i], p, now, tonumber(ARGV[base + 1]), id)
end
return n
