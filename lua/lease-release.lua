-- lease-release.lua: gives back leases whose requests finished, failed or were abandoned. One
-- call carries every release of one event-loop turn (src/limit/concurrency.ts batches them).
-- KEYS[i]  the lease ZSET of release i (under Redis Cluster, all of one hash slot); a key may
--          repeat when several leases of one key are released together.
-- ARGV[i]  the lease id to remove from KEYS[i].
-- Returns: the number of leases removed (a lease that already expired is not counted).
if #ARGV ~= #KEYS then
  return redis.error_reply('ERR lease-release.lua: expected ' .. #KEYS .. ' arguments, got ' .. #ARGV)
end
local removed = 0
for i = 1, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[i], ARGV[i])
end
return removed
