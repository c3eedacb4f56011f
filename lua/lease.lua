-- lease.lua: concurrency leases (issue 10), decided by limit.lua beside the rate limits, so one
-- call takes a request's leases and rate-limit units all or nothing.
-- KEYS: none of its own (library; the caller passes the check's key).  ARGV: none of its own.
-- Returns: nothing; registers ALGORITHMS[8].
-- State: ZSET, member = lease id (the limit call's id, ARGV[2] of limit.lua), score = the lease's
-- expiry in ms (Redis clock). A lease is held while its expiry is ahead of now: the holder renews
-- it (lua/lease-renew.lua) and releases it (lua/lease-release.lua); a holder that died stops
-- renewing, so its leases stop counting within the lease TTL without anyone cleaning up.
-- Parameters: limit = the most leases held at once, window = the lease TTL, cost = 1.

-- Admitted leases report this remaining, so that the RateLimit headers keep describing the
-- tightest rate limit (the deciding check of an admission is the one with the least remaining).
local LEASE_UNBOUNDED = 1125899906842624 -- 2^50

local function lease_check (key, p, now, r)
  local count = redis.call('ZCOUNT', key, '(' .. int(floor(now / 1000)), '+inf')
  if count + p.cost <= p.limit then
    return outcome(r, true, LEASE_UNBOUNDED, 0, 0, 0)
  end
  -- A lease may come back at any moment: Retry-After: 1 (the deny cache never holds these).
  return outcome(r, false, max(0, p.limit - count), 1000000, 1000000, 0)
end

local function lease_commit (key, p, now, r, id)
  local now_ms = floor(now / 1000)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now_ms))
  redis.call('ZADD', key, int(now_ms + p.window_ms), id)
  -- Never shortened: another instance's lease under a longer leaseTtl (a rolling change, a
  -- config that differs) would be deleted with the key while its request still runs.
  local ttl = ttl_ms(p.window_us)
  if redis.call('PTTL', key) < tonumber(ttl) then redis.call('PEXPIRE', key, ttl) end
  return 0
end

-- Redis Cluster: another slot rejected the request; this slot's lease is given back.
local function lease_refund (key, p, now, receipt, id)
  redis.call('ZREM', key, id)
end

-- A fallback's leases lived in one process and are gone once Redis is back: nothing to owe.
local function lease_charge (key, p, now, id)
end

ALGORITHMS[8] = { check = lease_check, commit = lease_commit, refund = lease_refund, charge = lease_charge }
