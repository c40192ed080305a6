-- aiolock lock: the lease left of whoever holds the lock (Lock.ttl()), read in one step:
-- the state outlives its holds (state.lua), so its PTTL alone does not say.
--
-- KEYS[1]  lock state (see state.lua)
--
-- Returns the remaining lease in ms, -1 if held without expiry, -2 if nobody holds it
-- (a key of another type: the GET's WRONGTYPE error).

local state = redis.call('get', KEYS[1])
if not state or string.byte(state, 1) == 124 then  -- (state.lua: a free state begins '|')
  return -2
end
return redis.call('pttl', KEYS[1])
