-- calendar-quota.lua: a counter per calendar period in UTC (hour, day, ISO week from Monday,
-- month): a consumer's quota. Twin of src/limit/algorithms/calendar-quota.ts.
-- KEYS: none of its own (library; the caller passes the check's key).  ARGV: none of its own.
-- Returns: nothing; registers ALGORITHMS[7].
-- The period is named by the check's windowMs: 3600000 hour, 86400000 day, 604800000 week,
-- 2678400000 month (its longest length). Dates use integer arithmetic only (Howard Hinnant's
-- days_from_civil / civil_from_days): Redis Lua has no os.date. maxDelayMs carries the clock's
-- UTC offset (quotaTimezone; 0 = UTC), see cq_read.
-- State: HASH { w = period start in seconds of the quota's clock (Unix seconds for UTC), or u = a
-- zoned hour's start in Unix seconds (cq_field), c = units
-- admitted in it }. As in
-- fixed-window.lua the period is stored: decisions never depend on when the key expires.

local function cq_days_from_civil (y, m, d)
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mm = m + 9
  if m > 2 then mm = m - 3 end
  local doy = floor((153 * mm + 2) / 5) + d - 1
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

local function cq_civil_from_days (days)
  local z = days + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local m = mp - 9
  if mp < 10 then m = mp + 3 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

-- start and end (exclusive) of the period holding `s`, all in seconds of the same (local) clock
local function cq_period (window_ms, s)
  local d = floor(s / 86400)
  if window_ms == 3600000 then
    local start = floor(s / 3600) * 3600
    return start, start + 3600
  elseif window_ms == 86400000 then
    return d * 86400, (d + 1) * 86400
  elseif window_ms == 604800000 then
    -- 1970-01-01 was a Thursday; Lua's % is floored, so this is 0..6 days since Monday
    local monday = d - (d + 3) % 7
    return monday * 86400, (monday + 7) * 86400
  end
  local y, m = cq_civil_from_days(d)
  local nxt
  if m == 12 then nxt = cq_days_from_civil(y + 1, 1, 1) else nxt = cq_days_from_civil(y, m + 1, 1) end
  return cq_days_from_civil(y, m, 1) * 86400, nxt * 86400
end

-- The clock the periods follow, in seconds east of UTC: maxDelayMs carries it for a quota
-- (0 = UTC, otherwise minutes + 1440; the gateway updates it as the zone's offset changes), plus
-- 4096 times the offset at the current period's end (minutes + 1440; below 4096: the same offset),
-- which a DST change inside the period makes differ. Periods are identified by their start on the
-- local clock, so a DST change within a month does not change the month's identity.
-- The hash field of the period start. A zoned hour (quotaTimezone set) is stored as its start in
-- Unix seconds under 'u', where the gateway before 2026-11-27 stored its local start under 'w': read
-- as a start, an old local start east of UTC lies hours ahead and looked like a clock stepped back,
-- which held a refused client for up to the zone's offset plus an hour. Under its own field, a
-- key written the old way starts its hour's count again, once.
local function cq_field (p)
  if p.window_ms == 3600000 and p.max_delay_ms ~= 0 then return 'u' end
  return 'w'
end

local function cq_read (key, p, now)
  local off, off_end = 0, 0
  if p.max_delay_ms ~= 0 then
    off = (p.max_delay_ms % 4096 - 1440) * 60
    off_end = off
    if p.max_delay_ms >= 4096 then off_end = (floor(p.max_delay_ms / 4096) - 1440) * 60 end
  end
  local start, stop = cq_period(p.window_ms, floor(now / 1000000) + off)
  -- An hour is identified by its start in Unix seconds and ends on the clock it started on: an
  -- autumn DST change repeats a local hour, and its second pass is an hour of its own.
  local hour = p.window_ms == 3600000
  if hour then
    off_end = 0
    start = start - off
    stop = start + 3600
  end
  local sw, sc = hash_get(key, cq_field(p), 'c')
  local cur = 0
  sw = tonumber(sw)
  local period = start
  -- A stored period ahead of now: the clock stepped back; keep counting in that later period.
  if sw and sw > start then
    period = sw
    if hour then
      stop = sw + 3600
    else
      local _, later_stop = cq_period(p.window_ms, sw)
      stop = later_stop
    end
  end
  if sw == period then cur = tonumber(sc) or 0 end
  return period, cur, (stop - off_end) * 1000000 - now
end

local function cq_check (key, p, now, r)
  local period, cur, to_end = cq_read(key, p, now)
  return counter_check(r, p, period, cur, to_end)
end

-- receipt = the period start the request was counted in.
local function cq_commit (key, p, now, r)
  hash_set(key, r.reset, cq_field(p), r.k, 'c', r.cur)
  return r.k
end

local function cq_refund (key, p, now, receipt)
  local s = redis.call('HMGET', key, cq_field(p), 'c')
  if tonumber(s[1]) == receipt then
    redis.call('HSET', key, 'c', int(max(0, (tonumber(s[2]) or 0) - p.cost)))
  end
end

-- Records `p.cost` units admitted elsewhere (a fallback's debt), at most one more quota's worth.
local function cq_charge (key, p, now)
  local period, cur, to_end = cq_read(key, p, now)
  redis.call('HSET', key, cq_field(p), int(period), 'c', int(min(cur + p.cost, 2 * p.limit)))
  redis.call('PEXPIRE', key, ttl_ms(to_end))
end

ALGORITHMS[7] = { check = cq_check, commit = cq_commit, refund = cq_refund, charge = cq_charge }
