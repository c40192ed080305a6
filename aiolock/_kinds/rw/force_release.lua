-- aiolock rw: delete a read-write lock whoever holds either side, with the claims of
-- its waiting writers, and wake the waiters (an administrator's tool).
--
-- KEYS[1]  hash: {hold field -> count, 'writer' -> field, 'writer_owner' -> owner id}
-- KEYS[2]  leases zset: {hold field -> lease end, server ms}
-- KEYS[3]  claims zset: {waiting writer's field -> claim end, server ms}
-- ARGV[1]  message to publish (the manager's id)
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns {code, value}:
--   { 1, 0   }  a hold (of either side) was live and everything is now deleted
--   { 0, 0   }  nobody held it (claims, if any, are deleted all the same)
--   {-1, type, key}  a key holds a value of another Redis type; it is left alone
--@include _kinds/rw/common

local hash, leases, claims = KEYS[1], KEYS[2], KEYS[3]
local bad = wrong_type(hash, leases, claims)
if bad then
  return bad
end
local now = now_ms()
purge(hash, leases, now)
local held = redis.call('exists', leases)
redis.call('del', hash, leases, claims)
redis.call('publish', hash .. ':released', ARGV[1])
return {held, 0}
