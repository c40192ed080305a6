-- aiolock redlock: what one master has for a Redlock name (a read; changes nothing).
--
-- KEYS[1]  lock key on this master
--
-- Returns:
--   { 1, token, pttl }  the key holds the token of an acquisition; pttl is its remaining
--                       lease in ms (-1: no expiry, which aiolock never sets)
--   { 0 }               no key
--   {-1, type}          a value of another Redis type
--
-- The client groups the masters' tokens: the lock is held when a majority of masters
-- have one token (see aiolock/_redlock/queries.py).

local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then
  return {0}
end
if kind ~= 'string' then
  return {-1, kind}
end
return {1, redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1])}
