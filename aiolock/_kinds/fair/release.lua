-- aiolock fair lock: release one hold; on the last one, grant the lock to the next
-- live waiter in the queue.
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  fence key (see fence.lua)
-- KEYS[3]  tombstone of this final release: lets a resent release answer as the first
-- KEYS[4]  queue zset: {waiter field -> arrival number} (see fair/queue.lua)
-- KEYS[5]  claims zset: {waiter field -> claim expiry, server ms}
-- ARGV[1]  owner field
-- ARGV[2]  hold count the client has before this release (>= 1); 1 = the last hold
-- ARGV[3]  the releasing hold's fencing token
-- ARGV[4]  fence state lifetime in ms ('0' none, '-1' forever)
-- ARGV[5]  tombstone lifetime in ms
-- ARGV[6]  claim_ttl in milliseconds: the pickup lease of the next waiter's grant
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns {code, value}:
--   { 1, count}  one hold released, still held; count holds are left
--   { 2, n    }  released (or a resend of a final release): the lock was granted to the
--                next live waiter and its field published (n = 1), or nobody waited and
--                nothing was published (n = 0)
--   { 0, 0    }  this owner does not hold the lock
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- The grant goes to the first waiter whose claim is live, with a pickup lease of
-- ARGV[6]: the waiter, woken by the message that names it, sets its own lease when it
-- picks the lock up, and a dead waiter's grant lapses within claim_ttl. Only that
-- waiter is woken; nobody can take the lock in between (no barging).
-- Idempotent, like the lock's release: a nested release sets the count to the client's
-- count minus one, and a final release leaves a tombstone for ARGV[5] ms.
--@include _kinds/_lua/fence
--@include _kinds/fair/queue
--@include _kinds/_lua/tombstone

local held = redis.pcall('hget', KEYS[1], ARGV[1])
if type(held) == 'table' and held.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
if not held then
  return resend_reply(KEYS[3])
end

local left = tonumber(ARGV[2]) - 1
if left > 0 then
  redis.call('hset', KEYS[1], ARGV[1], left)
  return {1, left}
end

redis.call('del', KEYS[1])
keep_fence(KEYS[2], ARGV[3], ARGV[4])
leave_tombstone(KEYS[3], ARGV[5])
local granted = grant_next(KEYS[1], KEYS[4], KEYS[5], now_ms(), ARGV[6], KEYS[1] .. ':released')
if granted == '' then
  return {2, 0}
end
return {2, 1}
