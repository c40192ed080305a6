-- aiolock semaphore: free every permit whoever holds it (an administrator's tool).
--
-- KEYS[1]  holders hash H (see acquire.lua)
-- KEYS[2]  holders' expiry zset E
-- ARGV[1]  message to publish (the manager's id)
-- The release channel is KEYS[1] .. ':released'. Claims of waiters are kept.
--
-- Returns {code, value}:
--   { 1, 0   }  permits were held and are now freed (holders find them gone)
--   { 0, 0   }  nothing was held
--   {-1, type}  KEYS[1] holds a value of another Redis type; it is left alone

local kind = redis.call('type', KEYS[1]).ok
if kind ~= 'none' and kind ~= 'hash' then
  return {-1, kind}
end
redis.call('del', KEYS[2])
if kind == 'none' then
  return {0, 0}
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[1] .. ':released', ARGV[1])
return {1, 0}
