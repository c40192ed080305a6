-- aiolock lock: give a detached hold back after an adoption cancelled or failed in flight.
--
-- KEYS[1]  lock state (see state.lua)
-- KEYS[2]  void marker of the adoption (adopt.lua's KEYS[2])
-- ARGV[1]  the adopting owner's field (adopt.lua's ARGV[2])
-- ARGV[2]  the detached field the adoption was to take over (adopt.lua's ARGV[1])
-- ARGV[3]  lifetime of the void marker in milliseconds (longer than any delayed adoption)
--
-- Returns {code, value} (names in codes.lua):
--   { 1, 0   }  DONE: the adoption had run: ARGV[2] holds the lock again (count 1), its
--               lease left as the adoption set it; the token is adoptable again
--   { 0, 0   }  NOT_DONE: the adoption had not run (or ARGV[1] no longer holds the lock)
--   {-1, type}  BAD_KEY: KEYS[1] holds a value of another Redis type (the marker is set
--               anyway)
--
-- Either way the void marker is set first: the give-back goes out on another connection
-- than the adoption, so Redis may run it before an adoption still on its way (or resent
-- by the client), which must then do nothing when it lands, or it would take the hold
-- for an adopter that gave up and the token would be dead (issue 36). Idempotent: a
-- resend finds ARGV[1] gone and answers {0, 0}.
--@include _kinds/lock/codes
--@include _kinds/lock/state
--@include _kinds/_lua/tombstone

void_attempt(KEYS[2], ARGV[3])
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
if field ~= ARGV[1] then
  return {NOT_DONE, 0}
end
redis.call('set', KEYS[1], encode_held(ARGV[2], 1, token, epoch, flag), 'keepttl')
return {DONE, 0}
