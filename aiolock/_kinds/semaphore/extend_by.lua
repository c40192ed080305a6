-- aiolock semaphore: add time to one permit's remaining lease in one step
-- (Permit.extend(additional=...)).
--
-- KEYS[1]  holders hash H (see acquire.lua)
-- KEYS[2]  holders' expiry zset E
-- KEYS[3]  limit key L (lives as long as H: permits.lua)
-- ARGV[1]  permit field
-- ARGV[2]  milliseconds to add to the lease left (a positive integer)
--
-- Returns the permit's lease left after the addition in milliseconds, or 0 if it is no
-- longer held (its lease ended on the server's clock, reclaimed, force-released, or a key
-- replaced by another type). An ended lease is never revived: another client may have
-- counted those permits as free. The lease left is read from E (the permit's own expiry),
-- not from H's TTL, which is the longest lease of all the semaphore's permits.
--@include _kinds/_lua/permits

local now = math.floor(now_us() / 1000)
local expiry = redis.pcall('zscore', KEYS[2], ARGV[1])
if type(expiry) ~= 'string' or tonumber(expiry) <= now then
  return 0
end
if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then
  return 0
end
local lease = tonumber(expiry) - now + tonumber(ARGV[2])
redis.call('zadd', KEYS[2], now + lease, ARGV[1])
-- H and E live as long as their longest lease: pushed back, never shortened (GT).
redis.call('pexpire', KEYS[1], lease, 'GT')
redis.call('pexpire', KEYS[2], lease, 'GT')
keep_limit(KEYS[3], lease)
return lease
