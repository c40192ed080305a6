-- aiolock rw: acquire the read or the write side of a read-write lock, or re-enter it.
--
-- KEYS[1]  hash: {hold field -> count, 'writer' -> field, 'writer_owner' -> owner id,
--          'writer_attempt' -> the void key of the attempt the write hold belongs to}
-- KEYS[2]  leases zset: {hold field -> lease end, server ms}
-- KEYS[3]  claims zset: {waiting writer's field -> claim end, server ms}
-- KEYS[4]  fence key: the last fencing token released (see fence.lua)
-- KEYS[5]  void marker of this attempt: present if an undo got there first
-- ARGV[1]  hold field (unique per acquisition; a waiting writer's claim field)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  hold count the client believes it has (0 for a new acquisition)
-- ARGV[4]  'r' for the read side, 'w' for the write side
-- ARGV[5]  owner id of the acquiring task (a read by the writer's task is a downgrade)
-- ARGV[6]  writers: how long a claim lasts unless refreshed, in milliseconds; '0': a
--          single attempt that registers no claim
--
-- Returns {code, value}:
--   { 1, token}  acquired anew; token is the new fencing token
--   { 2, count}  re-entered; count is the new hold count
--   { 0, ms   }  busy: ms until the first lease or claim in the way ends (at least 1),
--                or -2 (as PTTL for no key) for a re-entry of a hold that no longer exists
--   { 3, 0    }  voided: an undo reached Redis before this attempt did; nothing done
--   {-1, type, key}  a key holds a value of another Redis type; nothing done
--
-- Who gets in: a new read when no writer holds and no writer waits (no live claim), or
-- when the reading task holds the write side itself (a downgrade); a new write when
-- nobody holds either side. A write that must wait registers (or refreshes) its claim,
-- which makes new reads wait: a stream of readers cannot starve a writer. Re-entries
-- ignore claims. A resent attempt finds the count already at ARGV[3] + 1 and answers as
-- the first run did.
-- A waiting writer makes every attempt of its wait under one field (its claim's), so
-- the write hold records which attempt it belongs to ('writer_attempt', that attempt's
-- void key): the undo of an earlier attempt of the same wait, retried late after a
-- connection failure, must not drop a hold that a later attempt was granted.
--@include _kinds/_lua/fence
--@include _kinds/rw/common

local hash, leases, claims = KEYS[1], KEYS[2], KEYS[3]
local field, before = ARGV[1], tonumber(ARGV[3])
local bad = wrong_type(hash, leases, claims)
if bad then
  return bad
end
if redis.call('exists', KEYS[5]) == 1 then
  return {3, 0}
end
local now = now_ms()
purge(hash, leases, now)
purge_claims(claims, now)

local held = redis.call('hget', hash, field)
if held then  -- a re-entry, or a resent attempt that had run
  local count = tonumber(held)
  if count ~= before + 1 then
    count = redis.call('hincrby', hash, field, 1)
  end
  if before == 0 and redis.call('hget', hash, 'writer') == field then
    -- A writer's hold that an earlier attempt of this wait was granted (its reply was
    -- lost): this attempt takes it over, so that attempt's late undo leaves it alone.
    redis.call('hset', hash, 'writer_attempt', KEYS[5])
  end
  redis.call('zadd', leases, now + tonumber(ARGV[2]), field)
  settle(hash, leases, now)
  if count == 1 then
    return {1, fence(KEYS[4])}
  end
  return {2, count}
end
if before > 0 then
  return {0, -2}  -- the hold being re-entered ended (its lease, or a force release)
end

if ARGV[4] == 'r' then
  local writer_owner = redis.call('hget', hash, 'writer_owner')
  if writer_owner ~= ARGV[5] then  -- not a downgrade: writers come first
    local wait = first_end(claims, now)
    if writer_owner then
      local writer_end = tonumber(redis.call('zscore', leases, redis.call('hget', hash, 'writer')))
      writer_end = math.max(writer_end - now, 1)
      wait = wait and math.min(wait, writer_end) or writer_end
    end
    if wait then
      return {0, wait}
    end
  end
else
  local wait = first_end(leases, now)
  if wait then
    if ARGV[6] ~= '0' then
      -- Claim (or re-claim) a place: new readers wait from now on.
      local claim_end = now + tonumber(ARGV[6])
      redis.call('zadd', claims, claim_end, field)
      local last = redis.call('zrange', claims, -1, -1, 'withscores')
      redis.call('pexpire', claims, tonumber(last[2]) - now)
    end
    return {0, wait}
  end
  redis.call('zrem', claims, field)
  redis.call('hset', hash, 'writer', field, 'writer_owner', ARGV[5], 'writer_attempt', KEYS[5])
end
redis.call('hset', hash, field, 1)
redis.call('zadd', leases, now + tonumber(ARGV[2]), field)
settle(hash, leases, now)
return {1, fence(KEYS[4])}
