-- decide.lua: one request's checks decided all or nothing (library, no KEYS or ARGV of its own).
-- Shared by limit.lua (one request per call) and limit-batch.lua (the requests of one event-loop
-- turn in one call), so both decide with the very same code.
--
-- decide_request(keys, kbase, argv, abase, n, id, now): check i has its state key keys[kbase + i]
-- and its parameters argv[abase + i] ("code,limit,windowMs,burst,cost,maxDelayMs"). Returns limit.lua's
-- reply (see its header), or nil and an error message for bad parameters.
--
-- Phase 1 evaluates every check against the current state without writing anything. Only if
-- all of them admit does phase 2 write all of them: a request rejected by one dimension
-- consumes nothing in the others, and rejected requests are never recorded.

-- -1 (never) is the longest wait of all.
local function longer (a, b)
  if a < 0 then return b >= 0 end
  return b >= 0 and a > b
end

local function decide_request (keys, kbase, argv, abase, n, id, now)
  local now_ms = floor(now / 1000)
  if n == 0 then return { 1, 0, 0, 0, -1, 0, now_ms } end
  local params, results = {}, {}
  local rejecting, tightest = 0, 0
  for i = 1, n do
    local p = read_params(argv[abase + i])
    local algorithm = p and ALGORITHMS[p.code]
    if not algorithm then return nil, 'bad check parameters ' .. tostring(argv[abase + i]) end
    local r = algorithm.check(keys[kbase + i], p, now)
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
    reply[7 + i] = ALGORITHMS[params[i].code].commit(keys[kbase + i], params[i], now, results[i], id)
    delay = max(delay, ms_up(results[i].delay))
  end
  reply[6] = delay
  for i = 1, n do reply[7 + n + i] = max(0, results[i].remaining) end
  return reply
end
