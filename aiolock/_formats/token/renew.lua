-- aiolock token lock (wire="token"): compare-and-PEXPIRE many holds in one round trip
-- (renewal by the watchdog, extend(), and the check of a nested release).
--
-- KEYS[i]      lock i: a string at the lock name, holding its holder's token
-- ARGV[2i-1]   the token that should be in KEYS[i]
-- ARGV[2i]     new lease in milliseconds, or '0' to check the hold without extending it
--
-- Returns an array with one entry per key: 1 if KEYS[i] still holds that token (and its
-- lease was set, if asked), 0 if not (expired, released, taken by another, or the key
-- holds another type).

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
