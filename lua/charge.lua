-- charge.lua: records what a gateway admitted in process while Redis was unreachable (its
-- `onError: local` fallback), so the rest of each window accounts for it: a debt.
-- Appended after common.lua and the algorithm files by src/limit/scripts.ts.
--
-- KEYS[i]  the state key of check i (under Redis Cluster one call only gets keys of one slot).
-- ARGV[1]  now override in µs: "0" in production (Redis TIME), positive only in tests.
-- ARGV[2]  an id unique to this call (sliding-window-log members).
-- ARGV[2 + i]  check i as in limit.lua ("code,limit,windowMs,burst,cost,maxDelayMs"), where cost
--          is the number of units the fallback admitted for this key.
-- Returns: the number of keys charged.
--
-- Each algorithm's charge consumes the units even beyond the limit (the requests were already
-- forwarded), but at most one more limit's worth, so a runaway debt cannot lock a client out
-- for longer than one extra window.

local now = read_clock(ARGV[1])
local id = ARGV[2]
local n = #KEYS
if #ARGV ~= 2 + n then
  return redis.error_reply('ERR charge.lua: expected ' .. (2 + n) .. ' arguments, got ' .. #ARGV)
end
for i = 1, n do
  local p = read_params(ARGV[2 + i])
  local algorithm = p and ALGORITHMS[p.code]
  if not algorithm then
    return redis.error_reply('ERR charge.lua: bad check parameters ' .. tostring(ARGV[2 + i]))
  end
  algorithm.charge(KEYS[i], p, now, id .. ':' .. i)
end
return n
