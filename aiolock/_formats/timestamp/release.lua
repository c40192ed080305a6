-- aiolock timestamp lock (wire="timestamp"): the final release: delete the lock if it
-- still holds the expiry this hold wrote, then announce it to aiolock's waiters.
--
-- KEYS[1]  the lock: a string at the lock name, holding its holder's expiry
-- KEYS[2]  aiolock's holder record (see common.lua)
-- KEYS[3]  tombstone of this final release: lets a resent release answer as the first
-- ARGV[1]  owner field of the releasing hold
-- ARGV[2]  aiolock's release channel of this name
-- ARGV[3]  message to publish (the releasing manager's id)
-- ARGV[4]  '1' if the releasing manager itself listens on the channel, else '0'
-- ARGV[5]  tombstone lifetime in milliseconds
--
-- Returns an integer n: released, the key deleted and the release published, n other
-- aiolock clients heard it; else
--   {2}         a resend of a final release that had already freed the lock
--   {0}         the lock no longer holds this hold's expiry (stale and taken over)
--   {-1, type}  KEYS[1] holds a value of another Redis type; nothing done
--@include _formats/timestamp/common
--@include _kinds/_lua/tombstone

local held = redis.pcall('get', KEYS[1])
if type(held) == 'table' and held.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
if written_by(held, redis.call('get', KEYS[2]), ARGV[1]) then
  redis.call('del', KEYS[1], KEYS[2])
  leave_tombstone(KEYS[3], ARGV[5])
  return redis.call('publish', ARGV[2], ARGV[3]) - tonumber(ARGV[4])
end
return {resend_reply(KEYS[3])[1]}  -- {2} or {0}: this kind's codes come alone
