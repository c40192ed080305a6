-- aiolock semaphore: undo an attempt whose outcome is unknown (cancelled or failed in
-- flight), or withdraw the claim of a waiter that gives up.
--
-- KEYS[1]  holders hash H (see acquire.lua)
-- KEYS[2]  holders' expiry zset E
-- KEYS[3]  claims zset C
-- KEYS[4]  claims hash W
-- KEYS[5]  void marker of the attempt (acquire.lua's KEYS[7])
-- ARGV[1]  the request's field
-- ARGV[2]  lifetime of the void marker in milliseconds
-- ARGV[3]  message to publish (the manager's id)
--
-- Returns 1 if permits granted to the field were given back or its claim withdrawn
-- (then published: other waiters may fit now), else 0. Either way the void marker is
-- set, so an attempt still in flight (or resent) never takes effect.
--@include _kinds/_lua/permits
--@include _kinds/_lua/tombstone

local undone = 0
if drop_holder(KEYS[1], KEYS[2], ARGV[1]) > 0 then
  undone = 1
end
if drop_claim(KEYS[3], KEYS[4], ARGV[1]) == 1 then
  undone = 1
end
if undone == 1 then
  redis.call('publish', KEYS[1] .. ':released', ARGV[3])
end
void_attempt(KEYS[5], ARGV[2])
return undone
