-- aiolock lock: delete a lock whoever holds it, and wake a waiter (an administrator's tool).
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- ARGV[1]  release channel
-- ARGV[2]  message to publish (the manager's id)
--
-- Returns {code, value}:
--   { 1, 0   }  the lock was held and is now deleted
--   { 0, 0   }  nobody held it
--   {-1, type}  KEYS[1] holds a value of another Redis type; it is left alone

local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then
  return {0, 0}
end
if kind ~= 'hash' then
  return {-1, kind}
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[1], ARGV[2])
return {1, 0}
