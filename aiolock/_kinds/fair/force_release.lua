-- aiolock fair lock: delete the lock whoever holds it, and grant it to the next live
-- waiter (an administrator's tool).
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  queue zset: {waiter field -> arrival number} (see fair/queue.lua)
-- KEYS[3]  claims zset: {waiter field -> claim expiry, server ms}
-- ARGV[1]  claim_ttl in milliseconds: the pickup lease of the next waiter's grant
--
-- Returns {code, value}:
--   { 1, 0   }  the lock was held (or granted) and is now deleted
--   { 0, 0   }  nobody held it
--   {-1, type}  KEYS[1] holds a value of another Redis type; it is left alone
-- Either way (but the last) a free lock is then granted to the first live waiter.
--@include _kinds/fair/queue

local kind = redis.call('type', KEYS[1]).ok
if kind ~= 'none' and kind ~= 'hash' then
  return {-1, kind}
end
redis.call('del', KEYS[1])
grant_next(KEYS[1], KEYS[2], KEYS[3], now_ms(), ARGV[1], KEYS[1] .. ':released')
if kind == 'none' then
  return {0, 0}
end
return {1, 0}
