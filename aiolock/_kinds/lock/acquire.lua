-- aiolock lock: acquire a reentrant lock, or re-enter one the owner already holds.
--
-- KEYS[1]  lock hash: {owner field -> hold count}; one owner at a time
-- KEYS[2]  fence key: the last fencing token released (see fence.lua)
-- KEYS[3]  void marker of this attempt: present if an undo got there first
-- ARGV[1]  owner field (unique per acquisition)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  hold count the client believes it has (0 for a new acquisition)
--
-- Returns, on the common path, the new fencing token alone (an integer: acquired anew;
-- one reply element less to build costs the server more than the rest of the branch),
-- else {code, value}:
--   { 1, token}  acquired anew (a resent attempt); token is the new fencing token
--   { 2, count}  re-entered; count is the new hold count
--   { 0, pttl }  held by another owner; pttl is its remaining lease in ms (-1: none)
--   { 3, 0    }  voided: an undo reached Redis before this attempt did; nothing done
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- A resent command (the client retries after a dropped connection) finds the hold
-- count already at ARGV[3] + 1 and answers as the first run did instead of counting
-- twice; a resent new acquisition gets a fresh token, larger than the first run's.
--@include _kinds/_lua/fence

-- The common case first, in one read: the lock is free and the attempt not voided.
if redis.call('exists', KEYS[1], KEYS[3]) == 0 then
  local token = fence(KEYS[2])
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return token
end
-- Then the contended case, in as few commands: held by another owner.
local held = redis.pcall('hget', KEYS[1], ARGV[1])
if type(held) == 'table' then
  return {-1, redis.call('type', KEYS[1]).ok}  -- the key holds another type
end
if not held then
  -- Not ours. PTTL -2 means no lock key: then the first EXISTS counted the void marker.
  local ttl = redis.call('pttl', KEYS[1])
  if ttl == -2 then
    return {3, 0}
  end
  return {0, ttl}
end
if redis.call('exists', KEYS[3]) == 1 then
  return {3, 0}  -- a voided re-entry
end
local count = tonumber(held)
if count ~= tonumber(ARGV[3]) + 1 then
  count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
end
redis.call('pexpire', KEYS[1], ARGV[2])
if count == 1 then
  return {1, fence(KEYS[2])}
end
return {2, count}
