-- aiolock lock: undo an acquire attempt whose outcome is unknown (its caller was cancelled
-- in flight).
--
-- KEYS[1]  lock state (see state.lua)
-- KEYS[2]  void marker of the attempt (the acquire script's KEYS[2])
-- ARGV[1]  owner field
-- ARGV[2]  hold count the owner had before the attempt
-- ARGV[3]  lifetime of the void marker in milliseconds
-- ARGV[4]  release channel
-- ARGV[5]  message to publish (the manager's id)
-- ARGV[6]  how long a free state is kept, in ms ('-1' forever)
--
-- Returns 1 if the attempt had run and was undone (a new hold is released: its token
-- joins the epoch's released range; a re-entry uncounted), 0 if it had not run yet.
-- Either way the void marker is set first: a copy of the attempt still on its way (or
-- resent by the client) does nothing when it arrives (see _kinds/_lua/tombstone).
--@include _kinds/lock/codes
--@include _kinds/lock/state

redis.call('set', KEYS[2], '1', 'px', ARGV[3])
local before = tonumber(ARGV[2])
local state = redis.pcall('get', KEYS[1])
if type(state) == 'string' then
  local field, count, token, epoch, flag = decode_state(state)
  if field and field == ARGV[1] and count == before + 1 then
    if before == 0 then
      keep(KEYS[1], encode_free(epoch, token), ARGV[6])
      if flag ~= '' then
        redis.call('publish', ARGV[4], ARGV[5])
      end
    else
      redis.call('set', KEYS[1], encode_held(field, before, token, epoch, flag), 'keepttl')
    end
    return 1
  end
end
return 0
