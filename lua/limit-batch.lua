-- limit-batch.lua: the limit requests of one event-loop turn of one gateway instance, decided in
-- one call, in arrival order, each all or nothing exactly as one limit.lua call per request in
-- that order would decide it (decide_request in decide.lua; the parity test compares both).
-- Standalone Redis and Sentinel only: the keys of a batch span hash slots.
--
-- KEYS     first the lease keys of the L releases (see below), then every request's check keys,
--          request after request (a key may repeat).
-- ARGV[1]  now override in µs: "0" in production (Redis TIME, read once for the batch).
-- ARGV[2]  the number of requests R.
-- ARGV[3]  the number of lease releases L riding with this call, then their L lease ids: leases
--          given back since the instance's last call (src/limit/concurrency.ts), removed before
--          any request is decided, as lease-release.lua would.
-- Then per request: its id, its number of checks n, and its n check strings (as limit.lua).
-- Returns one string of comma-separated integers: per request, the length of its reply followed
-- by limit.lua's reply. One bulk string instead of an array of integers: the client decodes one
-- value per call instead of one per integer (issue 13; decoding the array cost the gateway more
-- CPU than building the call). Each number goes through '%d', as Redis turns a Lua number into an
-- integer reply (truncated), so the values are those limit.lua returns.
-- A malformed batch is refused whole (no reply); the string and hash state of its requests is
-- not written (sliding-window-log entries are, as they go straight to their sorted sets).

local now = read_clock(ARGV[1])
local count = tonumber(ARGV[2])
if not count or count < 1 then return redis.error_reply('ERR limit-batch.lua: bad request count ' .. tostring(ARGV[2])) end
local releases = tonumber(ARGV[3])
if not releases or releases < 0 or releases > #KEYS or 3 + releases > #ARGV then
  return redis.error_reply('ERR limit-batch.lua: bad release count ' .. tostring(ARGV[3]))
end
for i = 1, releases do redis.call('ZREM', KEYS[i], ARGV[3 + i]) end
local out = {}
-- '%d,%d,...' per reply length, built once per length in a call
local formats = {}
local k, a = releases, 3 + releases
-- string and hash keys read once and written once for the whole batch (common.lua)
batch_keys = {}
for _ = 1, count do
  local id = ARGV[a + 1]
  local n = tonumber(ARGV[a + 2])
  if not id or not n or a + 2 + n > #ARGV or k + n > #KEYS then
    return redis.error_reply('ERR limit-batch.lua: arguments do not match the request count')
  end
  local reply, problem = decide_request(KEYS, k, ARGV, a + 2, n, id, now)
  if not reply then return redis.error_reply('ERR limit-batch.lua: ' .. problem) end
  local n_reply = #reply
  local format = formats[n_reply]
  if not format then
    format = '%d' .. string.rep(',%d', n_reply)
    formats[n_reply] = format
  end
  out[#out + 1] = string.format(format, n_reply, unpack(reply))
  k = k + n
  a = a + 2 + n
end
if k ~= #KEYS or a ~= #ARGV then return redis.error_reply('ERR limit-batch.lua: arguments do not match the request count') end
flush_batch_keys()
return table.concat(out, ',')
