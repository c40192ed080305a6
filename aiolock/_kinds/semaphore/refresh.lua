-- aiolock semaphore: keep the claims of live waiters from expiring (one call per
-- semaphore and manager, every claim lifetime / 3).
--
-- KEYS[1]  claims zset C (see acquire.lua)
-- KEYS[2]  claims hash W
-- KEYS[3]  limit key L (lives as long as the claims: permits.lua)
-- ARGV[1]  claim lifetime in milliseconds
-- ARGV[2..] the claim fields of this manager's waiters
--
-- Returns how many claims were found and refreshed. A claim that had expired is not
-- revived here: its waiter's next attempt registers it anew (at the back).
--@include _kinds/_lua/permits

local now = math.floor(now_us() / 1000)
local expiry = now + tonumber(ARGV[1])
local refreshed = 0
for i = 2, #ARGV do
  local data = redis.call('hget', KEYS[2], ARGV[i])
  local n = data and string.match(data, '^(%d+):')
  if n then
    redis.call('hset', KEYS[2], ARGV[i], n .. ':' .. expiry)
    refreshed = refreshed + 1
  end
end
if refreshed > 0 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  redis.call('pexpire', KEYS[2], ARGV[1])
  keep_limit(KEYS[3], tonumber(ARGV[1]))
end
return refreshed
