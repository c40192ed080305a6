-- aiolock lock: end a hold whoever holds it, and wake a waiter (an administrator's tool).
--
-- KEYS[1]  lock state (see state.lua)
-- ARGV[1]  release channel
-- ARGV[2]  message to publish (the manager's id)
-- ARGV[3]  how long the free state is kept, in ms ('-1' forever)
--
-- Returns {code, value} (names in codes.lua):
--   { 1, 0   }  DONE: the lock was held and is now free
--   { 0, 0   }  NOT_DONE: nobody held it
--   {-1, type}  BAD_KEY: KEYS[1] holds a value of another Redis type; it is left alone
--
-- The free state it leaves starts a new epoch above every token given so far, so the
-- next holder's token is larger, and a resent release of the ended hold (or of any
-- earlier one) answers "not held".
--@include _kinds/lock/codes
--@include _kinds/lock/state

local state, bad = read_state(KEYS[1])
if bad then
  return bad
end
if not state then
  return {NOT_DONE, 0}
end
local field, _, token = decode_state(state)
if not field then
  return NOT_OURS
end
if field == '' then
  return {NOT_DONE, 0}
end
keep(KEYS[1], encode_free(token + 1, token), ARGV[3])
redis.call('publish', ARGV[1], ARGV[2])
return {DONE, 0}
