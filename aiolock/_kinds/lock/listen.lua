-- aiolock lock: register (or withdraw) a manager as a listener of a plain lock, for the
-- `aiolock show` command: the managers with a task waiting for the lock.
--
-- KEYS[1]  listeners zset of the lock: <lock hash>:listeners {manager id -> expiry, server ms}
-- ARGV[1]  the manager id
-- ARGV[2]  milliseconds the registration lasts unless refreshed; '0' withdraws it
--
-- Returns the number of live registrations left. Written only by a manager whose waiter
-- found the lock busy (when it subscribes to the release channel), refreshed while it
-- stays subscribed, withdrawn when it unsubscribes: never by an uncontended acquire.
-- Entries of crashed managers are pruned here and expire with the key.

local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
if ttl > 0 then
  redis.call('zadd', KEYS[1], now + ttl, ARGV[1])
  if redis.call('pttl', KEYS[1]) < ttl then
    redis.call('pexpire', KEYS[1], ttl)
  end
else
  redis.call('zrem', KEYS[1], ARGV[1])
end
return redis.call('zcard', KEYS[1])
