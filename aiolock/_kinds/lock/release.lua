-- aiolock lock: release one hold; on the last one, free the lock or hand it over.
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  fence key (see fence.lua)
-- KEYS[3]  tombstone of this final release: lets a resent release answer as the first
-- ARGV[1]  owner field
-- ARGV[2]  hold count the client has before this release (>= 1); 1 = the last hold
-- ARGV[3]  message to publish (the releasing manager's id)
-- ARGV[4]  the releasing hold's fencing token
-- ARGV[5]  fence state lifetime in ms ('0' none, '-1' forever)
-- ARGV[6]  tombstone lifetime in ms
-- ARGV[7]  owner field of a local successor to hand the lock to, or '' for none
-- ARGV[8]  the successor's lease in milliseconds
-- ARGV[9]  '1': hand over even if other clients listen on the channel
-- ARGV[10] '1' if the releasing manager itself listens on the channel, else '0'
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns, on the common path, an integer n alone: released, the key deleted and the
-- release published, n other clients heard it (the releasing manager then yields to
-- them); else {code, value}:
--   { 1, count}  one hold released, still held; count holds are left
--   { 2, 0    }  a resend of a final release that had freed the lock
--   { 4, token}  handed over: the successor now holds the lock with this fencing token
--   { 0, 0    }  this owner does not hold the lock
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- Idempotent, so a resent command is harmless: a nested release sets the count to the
-- client's count minus one (never decrements twice), and a final release leaves a
-- tombstone for ARGV[6] ms, so a resend finds it and answers as the first run did,
-- however many owners came and went in between. Who may receive a hand-over (fairness
-- between clients) is the engine's decision, passed in ARGV[10]; the script only
-- counts the other listeners when it must.
--@include _kinds/_lua/fence
--@include _kinds/_lua/tombstone

local early = release_count(KEYS[1], ARGV[1], ARGV[2], KEYS[3], ARGV[7], '0', '')
if early then
  return early
end

local channel = KEYS[1] .. ':released'
local mine = tonumber(ARGV[10])
if ARGV[7] ~= '' and (ARGV[9] == '1'
    or redis.call('pubsub', 'numsub', channel)[2] - mine <= 0) then
  return hand_over(KEYS[1], ARGV[7], ARGV[8], fence(KEYS[2]), KEYS[3], ARGV[6], '')
end
redis.call('del', KEYS[1])
keep_fence(KEYS[2], ARGV[4], ARGV[5])
leave_tombstone(KEYS[3], ARGV[6], '0')
return redis.call('publish', channel, ARGV[3]) - mine
