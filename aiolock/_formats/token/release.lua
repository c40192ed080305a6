-- aiolock token lock (wire="token"): the final release: compare-and-delete, then announce
-- the release to aiolock's waiters (other clients' waiters poll).
--
-- KEYS[1]  the lock: a string at the lock name, holding its holder's token
-- KEYS[2]  tombstone of this final release: lets a resent release answer as the first
-- ARGV[1]  the releasing hold's token
-- ARGV[2]  aiolock's release channel of this name
-- ARGV[3]  message to publish (the releasing manager's id)
-- ARGV[4]  '1' if the releasing manager itself listens on the channel, else '0'
-- ARGV[5]  tombstone lifetime in milliseconds
--
-- Returns an integer n: released, the key deleted and the release published, n other
-- aiolock clients heard it; else
--   {2}         a resend of a final release that had already freed the lock
--   {0}         the lock does not hold this token (expired, or taken by another)
--   {-1, type}  KEYS[1] holds a value of another Redis type; nothing done
--@include _kinds/_lua/tombstone

local held = redis.pcall('get', KEYS[1])
if type(held) == 'table' and held.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
if held == ARGV[1] then
  redis.call('del', KEYS[1])
  leave_tombstone(KEYS[2], ARGV[5])
  return redis.call('publish', ARGV[2], ARGV[3]) - tonumber(ARGV[4])
end
return {resend_reply(KEYS[2])[1]}  -- {2} or {0}: this kind's codes come alone
