-- aiolock rw: release one hold of either side; the last one ends the hold.
--
-- KEYS[1]  hash: {hold field -> count, 'writer' -> field, 'writer_owner' -> owner id}
-- KEYS[2]  leases zset: {hold field -> lease end, server ms}
-- KEYS[3]  fence key (see fence.lua)
-- KEYS[4]  tombstone of this final release: lets a resent release answer as the first
-- ARGV[1]  hold field
-- ARGV[2]  hold count the client has before this release (>= 1); 1 = the last hold
-- ARGV[3]  message to publish (the releasing manager's id)
-- ARGV[4]  the releasing hold's fencing token
-- ARGV[5]  fence state lifetime in ms ('0' none, '-1' forever)
-- ARGV[6]  tombstone lifetime in ms
-- ARGV[7]  '1' if the releasing manager itself listens on the channel, else '0'
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns {code, value}:
--   { 2, n    }  the hold ended; n other clients heard the release message (0 when
--                nothing was published: other readers still hold, so nobody waiting
--                could get in), or a resend of a final release that had run
--   { 1, count}  one hold released, still held; count holds are left
--   { 0, 0    }  this owner does not hold it
--   {-1, type, key}  a key holds a value of another Redis type; nothing done
--
-- The message is published when the release may let a waiter in: the write hold ended
-- (readers, and writers once no reader is left), or no hold at all is left (writers).
-- Idempotent like the lock's release: a nested release sets the count to the client's
-- count minus one, and a final release leaves a tombstone.
--@include _kinds/_lua/fence
--@include _kinds/rw/common
--@include _kinds/_lua/tombstone

local hash, leases, field = KEYS[1], KEYS[2], ARGV[1]
local bad = wrong_type(hash, leases)
if bad then
  return bad
end
local now = now_ms()
purge(hash, leases, now)

local held = redis.call('hget', hash, field)
if not held then
  return resend_reply(KEYS[4])
end
local left = tonumber(ARGV[2]) - 1
if left > 0 then
  redis.call('hset', hash, field, left)
  return {1, left}
end

local was_writer = drop(hash, leases, field)
settle(hash, leases, now)
-- Readers release out of order: keep the largest token released, never a smaller one.
keep_largest_fence(KEYS[3], ARGV[4], ARGV[5])
leave_tombstone(KEYS[4], ARGV[6])
if was_writer or redis.call('exists', leases) == 0 then
  return {2, redis.call('publish', hash .. ':released', ARGV[3]) - tonumber(ARGV[7])}
end
return {2, 0}
