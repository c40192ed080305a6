-- aiolock redlock: renew (or only check) many Redlock holds on one master in one call.
--
-- KEYS[i]      lock key i on this master
-- ARGV[2i-1]   token that should hold KEYS[i]
-- ARGV[2i]     new lease in milliseconds, or '0' to check without extending (fixed leases)
--
-- Returns an array with one entry per key: 1 if this master has the key for that token
-- (its lease renewed if asked), 0 if not. The client counts the masters that answered 1:
-- only a majority of them keeps a hold valid.

local held = {}
for i = 1, #KEYS do
  if redis.pcall('get', KEYS[i]) == ARGV[2 * i - 1] then
    if ARGV[2 * i] ~= '0' then
      redis.call('pexpire', KEYS[i], ARGV[2 * i])
    end
    held[i] = 1
  else
    held[i] = 0
  end
end
return held
