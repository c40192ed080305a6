-- aiolock, redisson wire format: delete a lock whoever holds it, and wake its waiters
-- (an administrator's tool; the same effect as Redisson's forceUnlock).
--
-- KEYS[1]  the lock hash at the raw lock name
-- ARGV[1]  the lock's channel, redisson_lock__channel:{name}
--
-- Returns {code, value}:
--   { 1, 0   }  the lock was held and is now deleted; the unlock message 0 published
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
redis.call('publish', ARGV[1], '0')
return {1, 0}
