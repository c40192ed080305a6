-- aiolock semaphore: read the state (changes nothing).
--
-- KEYS[1]  holders hash H (see acquire.lua)
-- KEYS[2]  holders' expiry zset E
-- KEYS[3]  limit key
-- KEYS[4]  claims hash W
--
-- Returns {limit (-1 if none stored), permits held, holders, claims}, counting only
-- holders whose lease has not ended on the server's clock.
--@include _kinds/_lua/permits

local now = math.floor(now_us() / 1000)
local limit = tonumber(redis.call('get', KEYS[3]) or -1)
local live = redis.call('zrangebyscore', KEYS[2], '(' .. now, '+inf')
local held = 0
if #live > 0 then
  for _, n in ipairs(redis.call('hmget', KEYS[1], unpack(live))) do
    held = held + tonumber(n or 0)
  end
end
return {limit, held, #live, redis.call('hlen', KEYS[4])}
