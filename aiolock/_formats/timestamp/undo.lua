-- aiolock timestamp lock (wire="timestamp"): undo a new acquisition whose outcome is
-- unknown (cancelled or failed in flight).
--
-- KEYS[1]  the lock: a string at the lock name
-- KEYS[2]  aiolock's holder record (see common.lua)
-- KEYS[3]  void marker of the attempt (the acquire script's KEYS[3])
-- ARGV[1]  owner field of the attempt
-- ARGV[2]  lifetime of the void marker in milliseconds
-- ARGV[3]  aiolock's release channel of this name
-- ARGV[4]  message to publish (the manager's id)
--
-- Returns 1 if the attempt had run and its lock is now deleted (and the release
-- announced), 0 if it had not. Either way the void marker is set first: a copy of the
-- attempt still on its way (or resent by the client) does nothing when it arrives.
--@include _formats/timestamp/common
--@include _kinds/_lua/tombstone

void_attempt(KEYS[3], ARGV[2])
local held = redis.pcall('get', KEYS[1])
if type(held) == 'string' and written_by(held, redis.call('get', KEYS[2]), ARGV[1]) then
  redis.call('del', KEYS[1], KEYS[2])
  redis.call('publish', ARGV[3], ARGV[4])
  return 1
end
return 0
