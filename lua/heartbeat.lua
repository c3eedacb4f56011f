-- Instance heartbeat: how many gateway instances share the Redis budget right now.
-- The count is what `onError: local` divides each limit by while Redis is unreachable.
-- KEYS[1]  ZSET of instance id -> last heartbeat (ms, Redis clock)
-- ARGV[1]  this instance's id
-- ARGV[2]  ms after which a silent instance is considered gone (integer)
-- Returns  the number of live instances, this one included (integer)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], string.format('%d', ttl))
return redis.call('ZCARD', KEYS[1])
