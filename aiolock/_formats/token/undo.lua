-- aiolock token lock (wire="token"): undo a new acquisition whose outcome is unknown
-- (cancelled or failed in flight).
--
-- KEYS[1]  the lock: a string at the lock name
-- KEYS[2]  void marker of the attempt (the acquire script's KEYS[2])
-- ARGV[1]  the attempt's token
-- ARGV[2]  lifetime of the void marker in milliseconds
-- ARGV[3]  aiolock's release channel of this name
-- ARGV[4]  message to publish (the manager's id)
--
-- Returns 1 if the attempt had run and its lock is now deleted (and the release
-- announced), 0 if it had not. Either way the void marker is set first: a copy of the
-- attempt still on its way (or resent by the client) does nothing when it arrives.
--@include _kinds/_lua/tombstone

void_attempt(KEYS[2], ARGV[2])
if redis.pcall('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', ARGV[3], ARGV[4])
  return 1
end
return 0
