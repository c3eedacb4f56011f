-- lease-renew.lua: pushes the expiry of leases still held (long downloads, open WebSockets) one
-- lease TTL ahead. Every holder renews all its leases in one call every third of the TTL.
-- KEYS[i]  the lease ZSET of lease i (under Redis Cluster, all of one hash slot).
-- ARGV[1]  the lease TTL in ms.
-- ARGV[1 + i]  the lease id in KEYS[i].
-- Returns: the number of leases renewed. A lease that expired already (its holder stalled for a
-- whole TTL) is not re-added: its slot may have been handed to another request meanwhile.
if #ARGV ~= #KEYS + 1 then
  return redis.error_reply('ERR lease-renew.lua: expected ' .. (#KEYS + 1) .. ' arguments, got ' .. #ARGV)
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local expiry = string.format('%d', now_ms + ttl)
local renewed = 0
for i = 1, #KEYS do
  -- only leases still held: an expired one is left for ZREMRANGEBYSCORE to drop
  local score = redis.call('ZSCORE', KEYS[i], ARGV[1 + i])
  if score and tonumber(score) > now_ms then
    redis.call('ZADD', KEYS[i], 'XX', expiry, ARGV[1 + i])
    -- never shortened: another instance's leases may run under a longer leaseTtl
    if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], string.format('%d', ttl)) end
    renewed = renewed + 1
  end
end
return renewed
