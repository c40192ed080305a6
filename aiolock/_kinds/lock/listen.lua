-- aiolock lock: register (or withdraw) a manager as a listener of many plain locks in one
-- call, for the `aiolock show` command: the managers with a task waiting for each lock.
--
-- KEYS[i]    listeners zset of lock i: <lock hash>:listeners {manager id -> expiry, server ms}
-- ARGV[1]    the manager id
-- ARGV[i+1]  milliseconds the registration at KEYS[i] lasts unless refreshed; '0' withdraws it
--
-- Returns nothing. Written only by a manager whose waiter found a lock busy (when it
-- subscribes to the release channel), refreshed while it stays subscribed, withdrawn when
-- it unsubscribes: never by an uncontended acquire. The manager sends its registrations
-- in batches (aiolock._engine.listeners), on Redis Cluster each of one slot. Entries of
-- crashed managers are pruned here and expire with the key.

local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
for i = 1, #KEYS do
  local key = KEYS[i]
  local ttl = tonumber(ARGV[i + 1])
  redis.call('zremrangebyscore', key, '-inf', now)
  if ttl > 0 then
    redis.call('zadd', key, now + ttl, id)
    if redis.call('pttl', key) < ttl then
      redis.call('pexpire', key, ttl)
    end
  else
    redis.call('zrem', key, id)
  end
end
return nil
