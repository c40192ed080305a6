-- aiolock lock: add time to one hold's remaining lease in one step (extend(additional=...)).
--
-- KEYS[1]   lock state (see state.lua)
-- ARGV[1]   owner field that should hold KEYS[1]
-- ARGV[2]   milliseconds to add to the lease left (a positive integer)
--
-- Returns the lease left after the addition in milliseconds, or 0 if that owner no longer
-- holds the lock (expired, force-released, evicted, or the key replaced by another type).
-- Reading PTTL and setting it in one script is what makes it an addition: read and set
-- from the client, the lease could end, or be set by another call, in between.

local state = redis.pcall('get', KEYS[1])
local head = ARGV[1] .. '|'  -- (state.lua: a held state begins '<field>|')
if type(state) ~= 'string' or string.sub(state, 1, #head) ~= head then
  return 0
end
local left = redis.call('pttl', KEYS[1])
if left < 0 then
  left = 0  -- no TTL (PERSISTed from outside): the lease becomes what is added
end
local lease = left + tonumber(ARGV[2])
redis.call('pexpire', KEYS[1], lease)
return lease
