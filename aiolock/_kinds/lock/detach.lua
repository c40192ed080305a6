-- aiolock lock: detach a hold from its owner task, for another task or process to adopt.
--
-- KEYS[1]  lock state (see state.lua)
-- ARGV[1]  owner field of the hold being detached
-- ARGV[2]  detached field: 'detached:<128 random bits, hex>', unique per detach
-- ARGV[3]  how long the detached lock stays held unless adopted, in milliseconds
--
-- Returns {code, value} (names in codes.lua):
--   { 1, 0   }  DONE: detached: ARGV[2] now holds the lock (count 1) for ARGV[3] ms
--   { 0, 0   }  NOT_DONE: the owner no longer holds the lock (expired, force-released);
--               nothing done
--   {-1, type}  BAD_KEY: KEYS[1] holds a value of another Redis type; nothing done
--
-- The client's hold count rules (an unconfirmed nested release may have left Redis's
-- higher): the client detaches only a hold it counts once, so the detached field holds
-- one. The token, epoch and waiter flag stay. Idempotent: a resend finds ARGV[1] gone
-- and ARGV[2] present, and answers as the first run did.
--@include _kinds/lock/codes
--@include _kinds/lock/state

local state, bad = read_state(KEYS[1])
if bad then
  return bad
end
if not state then
  return {NOT_DONE, 0}
end
local field, _, token, epoch, flag = decode_state(state)
if not field then
  return NOT_OURS
end
if field == ARGV[2] then
  return {DONE, 0}
end
if field ~= ARGV[1] then
  return {NOT_DONE, 0}
end
redis.call('set', KEYS[1], encode_held(ARGV[2], 1, token, epoch, flag), 'px', ARGV[3])
return {DONE, 0}
