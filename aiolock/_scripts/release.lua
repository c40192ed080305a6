-- aiolock: release one hold of a reentrant lock (or all of them), waking a waiter.
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  meta hash: {fence -> last fencing token, released -> id of the last final release}
-- ARGV[1]  owner field
-- ARGV[2]  hold count the client has before this release (>= 1)
-- ARGV[3]  release id, unique per release call
-- ARGV[4]  release channel
-- ARGV[5]  message to publish (the releasing manager's id)
-- ARGV[6]  lifetime of the meta hash in milliseconds
-- ARGV[7]  '1': release every hold of this owner at once; '0': one hold
--
-- Returns {code, value}:
--   { 1, count}  one hold released, still held; count holds are left
--   { 2, 0    }  released: key deleted, a message published
--   { 0, 0    }  this owner does not hold the lock
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- Idempotent, so a resent command is harmless: the count is set to the client's count
-- minus one (not decremented again), and a final release leaves its id in the meta hash
-- so that a resend of it finds the key gone and still answers "released".

local kind = redis.call('type', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  return {-1, kind}
end

local count = 0
if kind == 'hash' then
  count = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
end
if count == 0 then
  if redis.call('type', KEYS[2]).ok == 'hash'
      and redis.call('hget', KEYS[2], 'released') == ARGV[3] then
    return {2, 0}
  end
  return {0, 0}
end

local left = tonumber(ARGV[2]) - 1
if ARGV[7] == '1' then
  left = 0
end
if left > 0 then
  redis.call('hset', KEYS[1], ARGV[1], left)
  return {1, left}
end

redis.call('del', KEYS[1])
if redis.call('type', KEYS[2]).ok ~= 'hash' then
  redis.call('del', KEYS[2])
end
redis.call('hset', KEYS[2], 'released', ARGV[3])
redis.call('pexpire', KEYS[2], ARGV[6])
redis.call('publish', ARGV[4], ARGV[5])
return {2, 0}
