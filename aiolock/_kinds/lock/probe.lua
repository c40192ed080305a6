-- aiolock lock: a waiter's look at the lock at its holder's lease end (issue 24's quiet
-- wait): how long the current hold has left, and the waiter flag set on it, so that its
-- final release publishes (the flag goes with the hold whose lease ran out).
--
-- KEYS[1]  lock state (see state.lua)
-- ARGV[1]  the waiting manager's id
--
-- Returns the holder's remaining lease in ms, or -2 if the lock is free (or the key of
-- another type: the attempt that follows reports it), -1 if held without expiry.
--@include _kinds/lock/codes
--@include _kinds/lock/state

local state = redis.pcall('get', KEYS[1])
if type(state) ~= 'string' or string.byte(state, 1) == 124 then
  return -2
end
local field, count, token, epoch, flag = decode_state(state)
if not field then
  return -2  -- not a state of aiolock's: the attempt that follows reports it
end
local ttl = redis.call('pttl', KEYS[1])
if flag ~= ARGV[1] and flag ~= '*' then
  local marked = encode_held(field, count, token, epoch, flag == '' and ARGV[1] or '*')
  redis.call('set', KEYS[1], marked, 'keepttl')
end
return ttl
