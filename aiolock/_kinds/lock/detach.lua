-- aiolock lock: detach a hold from its owner task, for another task or process to adopt.
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- ARGV[1]  owner field of the hold being detached
-- ARGV[2]  detached field: 'detached:<128 random bits, hex>', unique per detach
-- ARGV[3]  how long the detached lock stays held unless adopted, in milliseconds
--
-- Returns {code, value}:
--   { 1, 0   }  detached: ARGV[2] now holds the lock (count 1) for ARGV[3] ms
--   { 0, 0   }  the owner no longer holds the lock (expired, force-released); nothing done
--   {-1, type}  KEYS[1] holds a value of another Redis type; nothing done
--
-- The client's hold count rules (an unconfirmed nested release may have left Redis's
-- higher): the client detaches only a hold it counts once, so the detached field holds
-- one. Idempotent: a resend finds ARGV[1] gone and ARGV[2] present, and answers as the
-- first run did.

local held = redis.pcall('hexists', KEYS[1], ARGV[1])
if type(held) == 'table' and held.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
if held == 0 then
  if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    return {1, 0}
  end
  return {0, 0}
end
redis.call('hset', KEYS[1], ARGV[2], 1)
redis.call('hdel', KEYS[1], ARGV[1])
redis.call('pexpire', KEYS[1], ARGV[3])
return {1, 0}
