-- lease-renew.lua: pushes the expiry of leases still held (long downloads, open WebSockets) one
-- lease TTL ahead. Every holder renews all its leases in one call every third of the TTL.
-- KEYS[i]  the lease ZSET of lease i (under Redis Cluster, all of one hash slot).
-- ARGV[1]  the lease TTL in ms.
-- ARGV[1 + i]  the lease id in KEYS[i].
-- Returns: the number of leases renewed. A lease Redis no longer has (restarted empty, failed over
-- with data loss, or its holder stalled for a whole TTL) is added again: its request still runs,
-- so it counts against the cap; left out, an open WebSocket would not count until it closed, and
-- the cap would admit that many more. The count may then stand above the cap for a while: new
-- requests are refused until it is back under, never admitted past it.
if #ARGV ~= #KEYS + 1 then
  return redis.error_reply('ERR lease-renew.lua: expected ' .. (#KEYS + 1) .. ' arguments, got ' .. #ARGV)
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local expiry = string.format('%d', now_ms + ttl)
local renewed = 0
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], expiry, ARGV[1 + i])
  -- never shortened: another instance's leases may run under a longer leaseTtl
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], string.format('%d', ttl)) end
  renewed = renewed + 1
end
return renewed
