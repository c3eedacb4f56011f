-- limit-batch.lua: the limit requests of one event-loop turn of one gateway instance, decided in
-- one call, in arrival order, each all or nothing exactly as one limit.lua call per request in
-- that order would decide it (decide_request in decide.lua; the parity test compares both).
-- Standalone Redis and Sentinel only: the keys of a batch span hash slots.
--
-- Every key and every check string of a batch is sent once, however many requests name it: the
-- global and api keys and the few check strings of a route are shared by all of a batch's
-- requests, and each argument costs the client an encoding and Redis a string (issue 13).
--
-- KEYS     the distinct keys of the batch: the lease keys of the releases and the requests'
--          check keys, each once, in the order of first use.
-- ARGV[1]  now override in µs: "0" in production (Redis TIME, read once for the batch).
-- ARGV[2]  the number of requests R.
-- ARGV[3]  the number of lease releases L riding with this call, then L strings <k>leaseId:
--          leases given back since the instance's last call (src/limit/concurrency.ts), lease id
--          leaseId in the ZSET KEYS[k], removed before any request is decided, as
--          lease-release.lua would.
-- Then the number of distinct check strings C, and the C check strings
--          ("code,limit,windowMs,burst,cost,maxDelayMs", as limit.lua).
-- Then one string per request: <n><k1><c1>...<kn><cn>id: its n checks, check i with the state
--          key KEYS[ki] and the check string number ci of the list above, then the request id.
-- <x> is a number written in three characters of '0'..'o' (base 64, most significant first, digit
-- d as the byte 48 + d): read with string.byte, no pattern and no string per number. Parsing
-- "n,k1,c1,..." with string.find cost Redis 2.4 µs per request, the byte codes 0.3 µs.
-- Returns one string of comma-separated integers: nowMs (Redis time of the batch, ms), then per
-- request limit.lua's reply without nowMs and receipts: allowed, remaining, retryAfterMs, resetMs,
-- limitingIndex, delayMs, then the n remainings, whether the request was allowed or not. The
-- client knows each request's n, so no length is sent. Every request of a batch is decided at the
-- one nowMs. Receipts are what refund.lua needs to undo a request admitted in one slot group and
-- refused in another, which only Redis Cluster has, and Cluster is never batched; sent, they were
-- a third of the reply's digits, formatted by Redis and read by the client for each request (and
-- the per-request length and nowMs two more of its twelve numbers). One bulk string instead of an
-- array of integers: the client decodes
-- one value per call instead of one per integer (issue 13; decoding the array cost the gateway
-- more CPU than building the call). Each number goes through '%d', as Redis turns a Lua number
-- into an integer reply (truncated), so the values are those limit.lua returns.
-- A malformed batch is refused whole (no reply); the string and hash state of its requests is
-- not written (sliding-window-log entries are, as they go straight to their sorted sets).

local byte, sub = string.byte, string.sub

-- The number coded at s[p .. p + 2], or nil (a byte outside '0'..'o', or missing).
local function code_at (s, p)
  local a, b, c = byte(s, p, p + 2)
  if not c or a < 48 or a > 111 or b < 48 or b > 111 or c < 48 or c > 111 then return nil end
  return (a - 48) * 4096 + (b - 48) * 64 + c - 48
end

local now = read_clock(ARGV[1])
local count = tonumber(ARGV[2])
if not count or count < 1 then return redis.error_reply('ERR limit-batch.lua: bad request count ' .. tostring(ARGV[2])) end
local releases = tonumber(ARGV[3])
if not releases or releases < 0 or 4 + releases > #ARGV then
  return redis.error_reply('ERR limit-batch.lua: bad release count ' .. tostring(ARGV[3]))
end
for i = 1, releases do
  local s = ARGV[3 + i]
  local k = code_at(s, 1)
  local key = k and KEYS[k]
  if not key then return redis.error_reply('ERR limit-batch.lua: bad lease release ' .. s) end
  redis.call('ZREM', key, sub(s, 4))
end
local a = 4 + releases
local check_count = tonumber(ARGV[a])
if not check_count or check_count < 1 or a + check_count + count ~= #ARGV then
  return redis.error_reply('ERR limit-batch.lua: arguments do not match the request count')
end
local checks = {}
for i = 1, check_count do checks[i] = ARGV[a + i] end
a = a + check_count

-- One request's string read into rk (its keys) and rc (its check strings), reused from request
-- to request (decide_request reads entries 1..n only). Returns n and the id, or nil.
local rk, rc = {}, {}
local function read_request (s)
  local n = code_at(s, 1)
  if not n then return nil end
  local p = 4
  for i = 1, n do
    -- A check's two codes from one string.byte call (a C call each, and a batch has many),
    -- decoded as code_at does, written out here: two calls of it per check cost 2% of a batch's
    -- Redis instructions (bench/instructions.js --contenders r).
    local a, b, c, d, e, f = byte(s, p, p + 5)
    if not f or a < 48 or a > 111 or b < 48 or b > 111 or c < 48 or c > 111
      or d < 48 or d > 111 or e < 48 or e > 111 or f < 48 or f > 111 then return nil end
    local key = KEYS[(a - 48) * 4096 + (b - 48) * 64 + c - 48]
    local check = checks[(d - 48) * 4096 + (e - 48) * 64 + f - 48]
    if not key or not check then return nil end
    rk[i], rc[i] = key, check
    p = p + 6
  end
  return n, sub(s, p)
end

local out = { string.format('%d', floor(now / 1000)) }
-- '%d,%d,...' per reply length, built once per length in a call
local formats = {}
-- string and hash keys read once and written once for the whole batch (common.lua)
batch_keys = {}
for r = 1, count do
  local n, id = read_request(ARGV[a + r])
  if not n then return redis.error_reply('ERR limit-batch.lua: bad request ' .. ARGV[a + r]) end
  -- neither nowMs nor receipts (see above)
  local reply, problem = decide_request(rk, 0, rc, 0, n, id, now, false)
  if not reply then return redis.error_reply('ERR limit-batch.lua: ' .. problem) end
  local n_reply = #reply
  local format = formats[n_reply]
  if not format then
    format = '%d' .. string.rep(',%d', n_reply - 1)
    formats[n_reply] = format
  end
  out[r + 1] = string.format(format, unpack(reply))
end
flush_batch_keys()
return table.concat(out, ',')
