-- aiolock fair lock: acquire in queue order, pick up a grant, or re-enter.
--
-- KEYS[1]  lock hash: {owner field -> hold count}; one owner at a time
-- KEYS[2]  fence key: the last fencing token released (see fence.lua)
-- KEYS[3]  void marker of this attempt: present if an undo got there first
-- KEYS[4]  queue zset: {waiter field -> arrival number} (see fair/queue.lua)
-- KEYS[5]  claims zset: {waiter field -> claim expiry, server ms}
-- ARGV[1]  owner field: a waiter's one field for its whole wait
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  hold count the client believes it has (0 for a new acquisition)
-- ARGV[4]  claim_ttl in milliseconds: a claim's lifetime, and a grant's pickup lease
-- ARGV[5]  '1': queue this waiter if it is not its turn; '0': a single attempt (timeout
--          0), which never queues
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns, on the common path (free, nobody queued), the new fencing token alone (an
-- integer); else {code, value}:
--   { 1, token}  acquired: the waiter was first in line, or picks up the lock a release
--                granted it (or this is a resend); token is the new fencing token
--   { 2, count}  re-entered; count is the new hold count
--   { 0, pttl }  not this waiter's turn: it is queued (at the tail if new); pttl is the
--                lock's remaining lease in ms (-1: none, -2: free)
--   { 3, 0    }  voided: an undo reached Redis before this attempt did; nothing done
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- No barging: a free lock goes to the first live waiter in the queue. If that is not
-- this one, it is granted to that one (with a pickup lease of ARGV[4]: a dead waiter's
-- grant does not block the lock for a whole lease) and its field is published, so that
-- its process wakes it alone; its next attempt finds the lock held under its own field
-- with count 1 and before 0 -- a pickup, which sets the real lease and the fencing token
-- (taken then: the hold starts then). A resend finds the same and answers the same way,
-- with a fresh, larger token.
--@include _kinds/_lua/fence
--@include _kinds/fair/queue

-- The common case first, in one read: free, nobody queued, and not voided.
if redis.call('exists', KEYS[1], KEYS[3], KEYS[4]) == 0 then
  local token = fence(KEYS[2])
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return token
end
if redis.call('exists', KEYS[3]) == 1 then
  return {3, 0}
end
local held = redis.pcall('hget', KEYS[1], ARGV[1])
if type(held) == 'table' then
  return {-1, redis.call('type', KEYS[1]).ok}
end
local before = tonumber(ARGV[3])
if held then
  local count = tonumber(held)
  if count ~= before + 1 then
    count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
  end
  redis.call('pexpire', KEYS[1], ARGV[2])
  if count == 1 then
    return {1, fence(KEYS[2])}
  end
  return {2, count}
end
if before > 0 then
  -- A re-entry of a hold that is gone: never queue it (the client reports the loss).
  return {0, redis.call('pttl', KEYS[1])}
end
local now = now_ms()
if redis.call('exists', KEYS[1]) == 0 then
  -- Free (a lease ran out, or an undo or force release freed it): first come first.
  purge(KEYS[4], KEYS[5], now)
  local head = redis.call('zrange', KEYS[4], 0, 0)[1]
  if not head or head == ARGV[1] then
    leave(KEYS[4], KEYS[5], ARGV[1])
    local token = fence(KEYS[2])
    redis.call('hset', KEYS[1], ARGV[1], 1)
    redis.call('pexpire', KEYS[1], ARGV[2])
    return {1, token}
  end
  grant_next(KEYS[1], KEYS[4], KEYS[5], now, ARGV[4], KEYS[1] .. ':released')
end
if ARGV[5] == '1' then
  register(KEYS[4], KEYS[5], ARGV[1], now, ARGV[4])
end
return {0, redis.call('pttl', KEYS[1])}
