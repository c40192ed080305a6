-- aiolock token lock (wire="token"): delete the lock whoever holds it, aiolock or another
-- client, and wake aiolock's waiters (an administrator's tool).
--
-- KEYS[1]  the lock: a string at the lock name
-- ARGV[1]  aiolock's release channel of this name
-- ARGV[2]  message to publish (the manager's id)
--
-- Returns {1, 0} if it was held and is now deleted, {0, 0} if nobody held it, and
-- {-1, type} if KEYS[1] holds a value of another Redis type (it is left alone).

local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then
  return {0, 0}
end
if kind ~= 'string' then
  return {-1, kind}
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[1], ARGV[2])
return {1, 0}
