-- aiolock semaphore: change the limit for every client (an administrator's tool).
--
-- KEYS[1]  limit key L (see acquire.lua)
-- KEYS[2]  holders hash H
-- KEYS[3]  claims zset C
-- ARGV[1]  the new limit (>= 1)
-- ARGV[2]  release channel
-- ARGV[3]  message to publish (the manager's id)
--
-- Returns the previous limit (0 if none was stored). Waiters everywhere are woken: a
-- raised limit may let them in. Permits held beyond a lowered limit are kept by their
-- holders; new requests wait until the total drops below the new limit.
-- The new limit lives as long as the semaphore is in use (the longest of L, H and C; see
-- permits.lua); on an idle semaphore it is kept until the next acquire ties it to use.

local old = tonumber(redis.call('get', KEYS[1]) or 0)
local ttl = math.max(redis.call('pttl', KEYS[1]), redis.call('pttl', KEYS[2]),
  redis.call('pttl', KEYS[3]))
if ttl > 0 then
  redis.call('set', KEYS[1], ARGV[1], 'px', ttl)
else
  redis.call('set', KEYS[1], ARGV[1])
end
redis.call('publish', ARGV[2], ARGV[3])
return old
