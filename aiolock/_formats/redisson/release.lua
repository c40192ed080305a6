-- aiolock, redisson wire format: release one hold; on the last one, free the lock (and
-- wake Redisson's waiters) or hand it to a local successor while nobody else waits.
--
-- KEYS[1]  the lock hash at the raw lock name: {owner field -> hold count}
-- KEYS[2]  tombstone of this final release (aiolock's own key): lets a resent release
--          answer as the first did
-- KEYS[3]  RFencedLock's token counter (see acquire.lua)
-- ARGV[1]  owner field
-- ARGV[2]  hold count the client has before this release (>= 1); 1 = the last hold
-- ARGV[3]  tombstone lifetime in ms
-- ARGV[4]  owner field of a local successor to hand the lock to, or '' for none
-- ARGV[5]  the successor's lease in milliseconds
-- ARGV[6]  '1': draw the successor's fencing token from KEYS[3]
-- ARGV[7]  '1' if the releasing manager itself listens on the channel, else '0'
-- ARGV[8]  the lock's channel, redisson_lock__channel:{name}
--
-- Returns {code, value}:
--   { 1, count}  one hold released, still held; count holds are left
--   { 2, n    }  released: the hash deleted and Redisson's unlock message published,
--                n other subscribers heard it (0 for a resend of a final release)
--   { 4, token}  handed over: the successor now holds the lock (token 0 without fencing)
--   { 0, 0    }  this owner does not hold the lock
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- The free path is Redisson's unlock: DEL the hash, then PUBLISH the integer 0 (its
-- UNLOCK_MESSAGE) on the channel, which is what a waiting Redisson client wakes on.
-- A hand-over happens only while no other client is subscribed to the channel, so a
-- waiting Redisson client is never passed over without a message. Idempotent: a nested
-- release sets the count to the client's count minus one, and a final release leaves a
-- tombstone ('r' released, 'h<token>' handed over) so a resend answers as the first.
--@include _kinds/_lua/tombstone

local early = release_count(KEYS[1], ARGV[1], ARGV[2], KEYS[2], ARGV[4], 'r', 'h')
if early then
  return early
end

local mine = tonumber(ARGV[7])
if ARGV[4] ~= '' and redis.call('pubsub', 'numsub', ARGV[8])[2] - mine <= 0 then
  local token = 0
  if ARGV[6] == '1' then
    token = redis.call('incr', KEYS[3])
  end
  return hand_over(KEYS[1], ARGV[4], ARGV[5], token, KEYS[2], ARGV[3], 'h')
end
redis.call('del', KEYS[1])
leave_tombstone(KEYS[2], ARGV[3], 'r')
return {2, redis.call('publish', ARGV[8], '0') - mine}
