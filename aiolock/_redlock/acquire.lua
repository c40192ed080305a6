-- aiolock redlock: take one master's vote for a Redlock acquisition.
--
-- KEYS[1]  lock key on this master: a string holding the acquisition's token
-- KEYS[2]  void marker of this acquisition: present if its undo or release reached this
--          master first
-- ARGV[1]  token of the acquisition (unique across clients)
-- ARGV[2]  lease in milliseconds
--
-- Returns {code, value}:
--   { 1, 0   }  this master now holds the key for the token (also when a resent command
--               finds it already there: the vote is the same)
--   { 0, pttl}  another token holds it; pttl is its remaining lease in ms (-1: none)
--   { 2, 0   }  voided: the undo or release of this acquisition ran here first; nothing
--               done
--   {-1, type}  KEYS[1] holds a value of another Redis type; nothing done
--
-- The void marker matters because the client sends the undo of a failed or cancelled
-- acquisition, and the release of a granted one, to every master, also to one whose
-- acquire is still on its way (a round is decided by a majority, and the undo or release
-- goes out on another connection): the late acquire must then not set a key that nobody
-- would ever release.

if redis.call('exists', KEYS[1], KEYS[2]) == 0 then
  redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
  return {1, 0}
end
local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then
  return {2, 0}  -- only the void marker exists
end
if kind ~= 'string' then
  return {-1, kind}
end
if redis.call('get', KEYS[1]) == ARGV[1] then
  return {1, 0}
end
return {0, redis.call('pttl', KEYS[1])}
