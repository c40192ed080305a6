-- aiolock lock: adopt a detached hold: the adopting task's field takes its place.
--
-- KEYS[1]  lock state (see state.lua)
-- KEYS[2]  void marker of this adoption: present if its give-back ran first
-- ARGV[1]  the field to take over (a detached field; see detach.lua)
-- ARGV[2]  the adopting owner's new field (unique per acquisition)
-- ARGV[3]  the adopter's lease in milliseconds
--
-- Returns {code, value} (names in codes.lua):
--   { 1, 0   }  DONE: adopted: ARGV[2] holds the lock (count 1), ARGV[1] is gone
--   { 0, pttl}  NOT_DONE: ARGV[1] does not hold the lock (adopted already, expired,
--               released or force-released); pttl is the lock's remaining lease in ms, -2 if free
--   { 3, 0   }  VOIDED: the give-back of this adoption (give_back.lua) ran first; the
--               adopter gave up, so nothing is done
--   {-1, type}  BAD_KEY: KEYS[1] holds a value of another Redis type; nothing done
--
-- A rename that happens once: a second adoption of the same field finds it gone. A
-- resend (the client retries after a dropped connection) finds ARGV[2] already there
-- and answers as the first run did.
--@include _kinds/lock/codes
--@include _kinds/lock/state

if redis.call('exists', KEYS[2]) == 1 then
  return {VOIDED, 0}
end
local state, bad = read_state(KEYS[1])
if bad then
  return bad
end
if not state then
  return {NOT_DONE, -2}
end
local field, _, token, epoch, flag = decode_state(state)
if not field then
  return NOT_OURS
end
if field == ARGV[2] then
  redis.call('pexpire', KEYS[1], ARGV[3])
  return {DONE, 0}
end
if field ~= ARGV[1] then
  if field == '' then
    return {NOT_DONE, -2}
  end
  return {NOT_DONE, redis.call('pttl', KEYS[1])}
end
redis.call('set', KEYS[1], encode_held(ARGV[2], 1, token, epoch, flag), 'px', ARGV[3])
return {DONE, 0}
