-- aiolock redlock: extend one master's part of a fixed-lease Redlock hold.
--
-- KEYS[1]  lock key on this master: a string holding the holder's token
-- ARGV[1]  token of the hold being extended
-- ARGV[2]  'set': the key's remaining lease becomes ARGV[3] ms; 'add': ARGV[3] ms are
--          added to what is left of it (one step, so no time passes between the read
--          and the write)
-- ARGV[3]  milliseconds
--
-- Returns the key's new remaining lease in ms if this master has the key for the token
-- (extended), 0 if not (expired, deleted, another token, or a key of another type: no
-- majority of such answers can keep the hold). The client counts the masters that
-- answered > 0: only a majority of them, within the hold's validity, extends it.

if redis.pcall('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
local ms = tonumber(ARGV[3])
if ARGV[2] == 'add' then
  -- a key without an expiry (-1) was not set by aiolock; counted from none left
  ms = ms + math.max(redis.call('pttl', KEYS[1]), 0)
end
redis.call('pexpire', KEYS[1], ms)
return ms
