-- aiolock, redisson wire format: acquire or re-enter a lock kept as Redisson's RLock.
--
-- KEYS[1]  the lock hash at the raw lock name: {"<client uuid>:<number>" -> hold count},
--          the structure Redisson's RLock reads and writes
-- KEYS[2]  void marker of this attempt (aiolock's own key): present if an undo got here
--          first
-- KEYS[3]  RFencedLock's token counter (redisson_lock_token:{name}); touched only when
--          ARGV[4] is '1'
-- ARGV[1]  owner field, Redisson-style: "<client uuid>:<number>"
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  hold count the client believes it has (0 for a new acquisition)
-- ARGV[4]  '1': draw a fencing token from KEYS[3] on a new acquisition, as RFencedLock
--          does; '0': leave KEYS[3] alone (the token is then 0)
--
-- Returns {code, value}:
--   { 1, token}  acquired anew (token 0 without fencing)
--   { 2, count}  re-entered; count is the new hold count
--   { 0, pttl }  held by another owner; pttl is its remaining lease in ms (-1: none)
--   { 3, 0    }  voided: an undo reached Redis before this attempt did; nothing done
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- The grant itself is Redisson's: when the hash is absent or already has our field,
-- HINCRBY the field and PEXPIRE the hash; otherwise report its PTTL. A Redisson client
-- running its own acquire on the same name sees exactly the state its script expects.
-- A resent command (after a dropped connection) finds the count already at ARGV[3] + 1
-- and answers as the first run did instead of counting twice.

if redis.call('exists', KEYS[2]) == 1 then
  return {3, 0}
end
local held = redis.pcall('hget', KEYS[1], ARGV[1])
if type(held) == 'table' then
  return {-1, redis.call('type', KEYS[1]).ok}  -- the key holds another type
end
if not held and redis.call('exists', KEYS[1]) == 1 then
  return {0, redis.call('pttl', KEYS[1])}
end
local count = tonumber(held or 0)
if count ~= tonumber(ARGV[3]) + 1 then
  count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
end
redis.call('pexpire', KEYS[1], ARGV[2])
if count == 1 then
  local token = 0
  if ARGV[4] == '1' then
    token = redis.call('incr', KEYS[3])
  end
  return {1, token}
end
return {2, count}
