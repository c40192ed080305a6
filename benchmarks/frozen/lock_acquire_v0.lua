-- Frozen copy of aiolock/_kinds/lock/acquire.lua before issue 21 (includes spliced), for benchmarks.script_floor.
-- aiolock lock: acquire a reentrant lock, or re-enter one the owner already holds.
--
-- KEYS[1]  lock hash: {owner field -> hold count}; one owner at a time
-- KEYS[2]  fence key: the last fencing token released (see fence.lua)
-- KEYS[3]  void marker of this attempt: present if an undo got there first
-- ARGV[1]  owner field (unique per acquisition)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  hold count the client believes it has (0 for a new acquisition)
--
-- Returns, on the common path, the new fencing token alone (an integer: acquired anew;
-- one reply element less to build costs the server more than the rest of the branch),
-- else {code, value}:
--   { 1, token}  acquired anew (a resent attempt); token is the new fencing token
--   { 2, count}  re-entered; count is the new hold count
--   { 0, pttl }  held by another owner; pttl is its remaining lease in ms (-1: none)
--   { 3, 0    }  voided: an undo reached Redis before this attempt did; nothing done
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- A resent command (the client retries after a dropped connection) finds the hold
-- count already at ARGV[3] + 1 and answers as the first run did instead of counting
-- twice; a resent new acquisition gets a fresh token, larger than the first run's.
-- aiolock prelude: the fencing rule, shared by every kind's scripts (spliced in by the
-- loader where a script says `--@include _kinds/_lua/fence`).
--
-- fence(key) -> a new fencing token for the resource whose fence key is `key`: the
-- server's clock in microseconds, forced above the last token released there (kept in
-- `key` only when the manager asks for fence state: fence_ttl). TIME is read afresh by
-- every call, and two scripts never run in the same microsecond, so tokens increase
-- strictly as long as the server's clock does not go back, and regardless of the clock
-- while the fence key lives.
-- keep_fence(key, token, ttl_ms) records `token` as the last one: ttl_ms '0' keeps
-- nothing, '-1' keeps it forever, else for ttl_ms milliseconds.
-- keep_largest_fence(key, token, ttl_ms) does the same unless a larger token is kept
-- already: for kinds whose holds end out of order (readers, permits), where the token
-- released last need not be the largest.

local function fence(key)
  local now = redis.call('time')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = redis.pcall('get', key)
  if type(last) == 'table' and last.err then
    error({err = 'WRONGTYPE key ' .. key .. ' holds a ' .. redis.call('type', key).ok
      .. ', not a fencing token'})
  end
  last = tonumber(last or 0)
  if token <= last then
    token = last + 1
  end
  return token
end

local function keep_fence(key, token, ttl_ms)
  if ttl_ms == '-1' then
    redis.call('set', key, token)
  elseif ttl_ms ~= '0' then
    redis.call('set', key, token, 'px', ttl_ms)
  end
end

local function keep_largest_fence(key, token, ttl_ms)
  if tonumber(token) > tonumber(redis.call('get', key) or 0) then
    keep_fence(key, token, ttl_ms)
  end
end


-- The common case first, in one read: the lock is free and the attempt not voided.
if redis.call('exists', KEYS[1], KEYS[3]) == 0 then
  local token = fence(KEYS[2])
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return token
end
-- Then the contended case, in as few commands: held by another owner.
local held = redis.pcall('hget', KEYS[1], ARGV[1])
if type(held) == 'table' then
  return {-1, redis.call('type', KEYS[1]).ok}  -- the key holds another type
end
if not held then
  -- Not ours. PTTL -2 means no lock key: then the first EXISTS counted the void marker.
  local ttl = redis.call('pttl', KEYS[1])
  if ttl == -2 then
    return {3, 0}
  end
  return {0, ttl}
end
if redis.call('exists', KEYS[3]) == 1 then
  return {3, 0}  -- a voided re-entry
end
local count = tonumber(held)
if count ~= tonumber(ARGV[3]) + 1 then
  count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
end
redis.call('pexpire', KEYS[1], ARGV[2])
if count == 1 then
  return {1, fence(KEYS[2])}
end
return {2, count}
