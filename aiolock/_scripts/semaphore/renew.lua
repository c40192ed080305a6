-- aiolock semaphore: renew or check many permits in one round trip (also extend).
--
-- KEYS[3i-2]  holders hash H of permit i (see acquire.lua)
-- KEYS[3i-1]  holders' expiry zset E of permit i
-- KEYS[3i]    limit key L of permit i's semaphore (lives as long as H: permits.lua)
-- ARGV[2i-1]  permit field i
-- ARGV[2i]    new lease in milliseconds from now, or '0' to check without extending
--
-- Returns an array with one entry per permit: 1 if it is still held (lease not ended on
-- the server's clock; renewed if asked), 0 if not (expired, reclaimed, force-released,
-- or a key replaced by another type). An ended lease is never revived: another client
-- may have counted those permits as free.
--@include permits

local now = math.floor(now_us() / 1000)
local held = {}
for i = 1, #KEYS / 3 do
  local H, E, L = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local field, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local expiry = redis.pcall('zscore', E, field)
  if type(expiry) == 'string' and tonumber(expiry) > now
      and redis.pcall('hexists', H, field) == 1 then
    if lease > 0 then
      redis.call('zadd', E, now + lease, field)
      expire_holders(H, E, now, L)
    end
    held[i] = 1
  else
    held[i] = 0
  end
end
return held
