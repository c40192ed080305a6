-- aiolock semaphore: give back the permits of one holder.
--
-- KEYS[1]  holders hash H (see acquire.lua)
-- KEYS[2]  holders' expiry zset E
-- KEYS[3]  fence key (see fence.lua)
-- KEYS[4]  tombstone of this release: lets a resent release answer as the first
-- ARGV[1]  permit field
-- ARGV[2]  message to publish (the releasing manager's id)
-- ARGV[3]  the permit's fencing token
-- ARGV[4]  fence state lifetime in ms ('0' none, '-1' forever)
-- ARGV[5]  tombstone lifetime in ms
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns, on the common path, an integer n alone: released and published, n clients
-- heard it (the releasing one included, if it listens); else {code, value}:
--   { 2, 0   }  a resend of a release that had run
--   { 0, 0   }  this permit is not held (its lease ended and it was reclaimed, or it
--               was force-released)
--   {-1, type}  KEYS[1] holds a value of another Redis type; nothing done
--@include _kinds/_lua/fence
--@include _kinds/_lua/permits
--@include _kinds/_lua/tombstone

local held = redis.pcall('hget', KEYS[1], ARGV[1])
if type(held) == 'table' and held.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
if not held then
  return resend_reply(KEYS[4])
end
drop_holder(KEYS[1], KEYS[2], ARGV[1])
-- Tokens are issued while others hold: keep the largest, never a smaller one.
keep_largest_fence(KEYS[3], ARGV[3], ARGV[4])
leave_tombstone(KEYS[4], ARGV[5])
return redis.call('publish', KEYS[1] .. ':released', ARGV[2])
