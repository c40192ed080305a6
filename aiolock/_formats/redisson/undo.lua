-- aiolock, redisson wire format: undo an acquire attempt whose outcome is unknown
-- (cancelled or failed in flight).
--
-- KEYS[1]  the lock hash at the raw lock name: {owner field -> hold count}
-- KEYS[2]  void marker of the attempt (acquire.lua's KEYS[2]; aiolock's own key)
-- ARGV[1]  owner field
-- ARGV[2]  hold count the owner had before the attempt
-- ARGV[3]  lifetime of the void marker in milliseconds
-- ARGV[4]  the lock's channel, redisson_lock__channel:{name}
--
-- Returns 1 if the attempt had run and was undone (a new hold is released, with
-- Redisson's unlock message, so its waiters wake; a re-entry is uncounted), 0 if it had
-- not run yet. Either way the void marker is set first: a copy of the attempt still on
-- its way (or resent by the client) does nothing when it arrives.
--@include _kinds/_lua/tombstone

void_attempt(KEYS[2], ARGV[3])
local before = tonumber(ARGV[2])
local count = redis.pcall('hget', KEYS[1], ARGV[1])
if type(count) ~= 'table' and tonumber(count or 0) == before + 1 then
  if before == 0 then
    redis.call('del', KEYS[1])
    redis.call('publish', ARGV[4], '0')
  else
    redis.call('hset', KEYS[1], ARGV[1], before)
  end
  return 1
end
return 0
