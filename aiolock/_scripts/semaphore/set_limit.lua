-- aiolock semaphore: change the limit for every client (an administrator's tool).
--
-- KEYS[1]  limit key (see acquire.lua)
-- ARGV[1]  the new limit (>= 1)
-- ARGV[2]  release channel
-- ARGV[3]  message to publish (the manager's id)
--
-- Returns the previous limit (0 if none was stored). Waiters everywhere are woken: a
-- raised limit may let them in. Permits held beyond a lowered limit are kept by their
-- holders; new requests wait until the total drops below the new limit.

local old = tonumber(redis.call('get', KEYS[1]) or 0)
redis.call('set', KEYS[1], ARGV[1])
redis.call('publish', ARGV[2], ARGV[3])
return old
