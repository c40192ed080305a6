-- aiolock lock: undo an acquire attempt whose outcome is unknown (cancelled or failed
-- in flight).
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  void marker of the attempt (the acquire script's KEYS[3])
-- ARGV[1]  owner field
-- ARGV[2]  hold count the owner had before the attempt
-- ARGV[3]  lifetime of the void marker in milliseconds
-- ARGV[4]  release channel
-- ARGV[5]  message to publish (the manager's id)
--
-- Returns 1 if the attempt had run and was undone (a new hold is released, a re-entry
-- uncounted), 0 if it had not run yet: the void marker then makes sure it never does.
--@include _kinds/_lua/tombstone

local before = tonumber(ARGV[2])
local count = redis.pcall('hget', KEYS[1], ARGV[1])
if type(count) ~= 'table' and tonumber(count or 0) == before + 1 then
  if before == 0 then
    redis.call('del', KEYS[1])
    redis.call('publish', ARGV[4], ARGV[5])
  else
    redis.call('hset', KEYS[1], ARGV[1], before)
  end
  return 1
end
void_attempt(KEYS[2], ARGV[3])
return 0
