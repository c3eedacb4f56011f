-- decide.lua: one request's checks decided all or nothing (library, no KEYS or ARGV of its own).
-- Shared by limit.lua (one request per call) and limit-batch.lua (the requests of one event-loop
-- turn in one call), so both decide with the very same code.
--
-- decide_request(keys, kbase, argv, abase, n, id, now, single): check i has its state key
-- keys[kbase + i] and its parameters argv[abase + i] ("code,limit,windowMs,burst,cost,maxDelayMs").
-- Returns limit.lua's reply (see its header) when `single`, or nil and an error message for bad
-- parameters. Without `single` (limit-batch.lua) the reply has neither nowMs (the batch sends it
-- once) nor receipts (only Redis Cluster refunds, and it is never batched): the remainings follow
-- the first six values.
--
-- Phase 1 evaluates every check against the current state without writing anything. Only if
-- all of them admit does phase 2 write all of them: a request rejected by one dimension
-- consumes nothing in the others, and rejected requests are never recorded.

-- -1 (never) is the longest wait of all.
local function longer (a, b)
  if a < 0 then return b >= 0 end
  return b >= 0 and a > b
end

-- Check i's parameters and outcome, kept from request to request (a batch decides many): entries
-- past a request's n are left from an earlier one and never read. An outcome table starts with
-- room for its five fields and the few an algorithm adds for its commit.
local params, results = {}, {}

-- The reply, one table for every request of a call: its first `length` entries are set and the
-- rest cleared, so # and Redis's conversion of a returned table see exactly this reply. Whoever
-- calls decide_request reads the reply before the next request is decided. It starts with room
-- for four checks: one call per request would otherwise grow it from empty every time.
-- reply_length counts every entry that may be set: under FCALL the table outlives a call, and a
-- call that fails while it writes a reply (a commit's command refused) must leave nothing that
-- the next call's reply would carry, so reply_reaches is called before the entries are written.
local reply = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
local reply_length = #reply
local function reply_reaches (length)
  if length > reply_length then reply_length = length end
end
local function reply_ends (length)
  for k = length + 1, reply_length do reply[k] = nil end
  reply_length = length
  return reply
end

local function decide_request (keys, kbase, argv, abase, n, id, now, single)
  if n == 0 then
    if single then return { 1, 0, 0, 0, -1, 0, floor(now / 1000) } end
    return { 1, 0, 0, 0, -1, 0 }
  end
  local rejecting, tightest = 0, 0
  for i = 1, n do
    local p = read_params(argv[abase + i])
    local algorithm = p and ALGORITHMS[p.code]
    if not algorithm then return nil, 'bad check parameters ' .. tostring(argv[abase + i]) end
    local r = results[i]
    if not r then
      r = { ok = false, remaining = 0, retry = 0, reset = 0, delay = 0 }
      results[i] = r
    end
    algorithm.check(keys[kbase + i], p, now, r)
    params[i] = p
    if not r.ok then
      if rejecting == 0 or longer(r.retry, results[rejecting].retry) then rejecting = i end
    elseif tightest == 0 or r.remaining < results[tightest].remaining then
      tightest = i
    end
  end

  -- the values before the remainings: six, and nowMs when single
  local head = 6
  if single then head = 7 end
  if rejecting > 0 then
    local r = results[rejecting]
    reply_reaches(head + n)
    local retry = -1
    if r.retry >= 0 then retry = max(1, ms_up(r.retry)) end
    reply[1], reply[2], reply[3], reply[4], reply[5], reply[6] = 0, r.remaining, retry, ms_up(r.reset), rejecting - 1, 0
    if single then reply[7] = floor(now / 1000) end
    for i = 1, n do
      -- An admitting check's remaining counts this request, which was not recorded: add it back.
      if results[i].ok then reply[head + i] = results[i].remaining + params[i].cost else reply[head + i] = max(0, results[i].remaining) end
    end
    return reply_ends(head + n)
  end

  local t = results[tightest]
  reply[1], reply[2], reply[3], reply[4], reply[5] = 1, t.remaining, 0, ms_up(t.reset), tightest - 1
  -- comparisons rather than max() and ms_up(): each math call is a C call, and these run for
  -- every check of every request of a batch
  local delay = 0
  -- where the remainings start: after the receipts when single
  local at = head
  if single then at = 7 + n end
  reply_reaches(at + n)
  if single then reply[7] = floor(now / 1000) end
  for i = 1, n do
    local p, r = params[i], results[i]
    local receipt = ALGORITHMS[p.code].commit(keys[kbase + i], p, now, r, id)
    if single then reply[7 + i] = receipt end
    local d = r.delay
    if d > 0 then
      d = ms_up(d)
      if d > delay then delay = d end
    end
    local left = r.remaining
    if left < 0 then left = 0 end
    reply[at + i] = left
  end
  reply[6] = delay
  return reply_ends(at + n)
end
