-- aiolock semaphore: take some permits, or register (or keep) a claim and wait.
--
-- KEYS[1]  holders hash H: {permit field -> permits, '#held' -> total}
-- KEYS[2]  holders' expiry zset E: {permit field -> expiry ms, server clock}
-- KEYS[3]  claims zset C: {claim field -> arrival us, server clock}
-- KEYS[4]  claims hash W: {claim field -> '<permits>:<expiry ms>'}
-- KEYS[5]  limit key L: the semaphore's limit (a string; lives as long as H or C)
-- KEYS[6]  fence key: the last fencing token issued (see fence.lua)
-- KEYS[7]  void marker of this attempt: present if an undo got there first
-- ARGV[1]  field of this request (its permit field once granted, its claim meanwhile)
-- ARGV[2]  permits asked for (>= 1)
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  the limit the client's handle was made with
-- ARGV[5]  claim lifetime in milliseconds; '0': a single attempt that registers no claim
-- ARGV[6]  fence state lifetime in ms ('0' none, '-1' forever)
-- ARGV[7]  message to publish when expired permits were reclaimed (the manager's id)
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns, on the common path, the new fencing token alone (an integer: granted), else
-- {code, value}:
--   { 1, token}  granted (a resend of an attempt that had already been granted)
--   { 0, ms   }  not enough free permits: the request's claim is registered (or kept);
--                ms is how long until a permit's lease or a claim ahead of it ends
--                (-1: none), the longest the waiter should sleep
--   { 3, 0    }  voided: an undo reached Redis before this attempt did; nothing done
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--   {-2, limit}  a new request whose handle was made with another limit; nothing done
--   {-3, limit}  a waiting request asks for more permits than the (lowered) limit
--
-- Policy: a request is granted if held + (permits claimed by requests that registered
-- before it) + its own permits <= limit. A request that does not fit registers a claim
-- and keeps it until it is granted or gives up, so requests arriving later (from any
-- client) cannot take the permits it waits for. Granting a claimant turns its claim
-- into a hold, which changes no other request's sum: only releases, expiries, withdrawn
-- claims and a raised limit can let a waiter in, and each of them publishes (or, for
-- an expiry, is covered by the waiter's sleep bound).
--@include _kinds/_lua/fence
--@include _kinds/_lua/permits

if redis.call('exists', KEYS[7]) == 1 then
  return {3, 0}
end
local check = redis.pcall('hget', KEYS[1], TOTAL)
if type(check) == 'table' and check.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
local field, want = ARGV[1], tonumber(ARGV[2])
local us = now_us()
local now = math.floor(us / 1000)

local limit = tonumber(redis.call('get', KEYS[5]))
if not limit then
  limit = tonumber(ARGV[4])
  -- Stored while the semaphore is in use: the paths below push its expiry back with
  -- every lease or claim they set (keep_limit); this one covers what exists already.
  local ttl = math.max(tonumber(ARGV[3]), redis.call('pttl', KEYS[1]),
    redis.call('pttl', KEYS[3]))
  redis.call('set', KEYS[5], ARGV[4], 'px', ttl)
end

if redis.call('hexists', KEYS[1], field) == 1 then
  -- A resend of an attempt that was granted: answer as it did (with a fresh token).
  local token = fence(KEYS[6])
  keep_fence(KEYS[6], token, ARGV[6])
  return {1, token}
end

local channel = KEYS[1] .. ':released'
local freed = prune(KEYS[1], KEYS[2], now)
local ahead, mine, until_ms = 0, false, nil
for _, claim in ipairs(live_claims(KEYS[3], KEYS[4], now)) do
  if claim[1] == field then
    mine = true
    break
  end
  ahead = ahead + claim[2]
  if not until_ms or claim[3] < until_ms then
    until_ms = claim[3]
  end
end
if not mine and limit ~= tonumber(ARGV[4]) then
  return {-2, limit}
end
if want > limit then
  return {-3, limit}
end

local held = tonumber(redis.call('hget', KEYS[1], TOTAL) or 0)
if held + ahead + want <= limit then
  if mine then
    drop_claim(KEYS[3], KEYS[4], field)
  end
  redis.call('hset', KEYS[1], field, want)
  redis.call('hincrby', KEYS[1], TOTAL, want)
  redis.call('zadd', KEYS[2], now + tonumber(ARGV[3]), field)
  if mine then
    expire_holders(KEYS[1], KEYS[2], now)
    fit_limit(KEYS[5], KEYS[1], KEYS[3])
  else
    expire_holders(KEYS[1], KEYS[2], now, KEYS[5])
  end
  local token = fence(KEYS[6])
  keep_fence(KEYS[6], token, ARGV[6])
  if freed > 0 then
    redis.call('publish', channel, ARGV[7])  -- crashed holders' permits came back
  end
  return token
end

if ARGV[5] ~= '0' then
  if not mine then
    redis.call('zadd', KEYS[3], us, field)
  end
  redis.call('hset', KEYS[4], field, want .. ':' .. (now + tonumber(ARGV[5])))
  redis.call('pexpire', KEYS[3], ARGV[5])
  redis.call('pexpire', KEYS[4], ARGV[5])
  keep_limit(KEYS[5], tonumber(ARGV[5]))
end
if freed > 0 then
  redis.call('publish', channel, ARGV[7])
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if first[2] and (not until_ms or tonumber(first[2]) < until_ms) then
  until_ms = tonumber(first[2])
end
if not until_ms then
  return {0, -1}
end
return {0, math.max(1, until_ms - now)}
