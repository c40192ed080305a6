-- aiolock timestamp lock (wire="timestamp"): renew (rewrite the expiry of) or check many
-- holds in one round trip (the watchdog, extend(), and the check of a nested release).
--
-- KEYS[2i-1]   lock i: a string at the lock name, holding its holder's expiry
-- KEYS[2i]     aiolock's holder record of lock i (see common.lua)
-- ARGV[2i-1]   owner field of the hold on lock i
-- ARGV[2i]     new lease in milliseconds (the expiry becomes server time + lease), or
--              '0' to check the hold without renewing it
--
-- Returns an array with one entry per lock: 1 if that hold still holds it (and its
-- expiry was rewritten, if asked), 0 if not (stale and taken over, released, or the key
-- holds another type).
--@include _formats/timestamp/common

local now = now_ms()
local held = {}
for i = 1, #KEYS / 2 do
  local lock, record_key, field = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1]
  local value = redis.pcall('get', lock)
  if type(value) == 'string' and written_by(value, redis.call('get', record_key), field) then
    if ARGV[2 * i] ~= '0' then
      write(lock, record_key, field, now, ARGV[2 * i])
    end
    held[i] = 1
  else
    held[i] = 0
  end
end
return held
