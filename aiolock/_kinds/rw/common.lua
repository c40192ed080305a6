-- aiolock read-write lock prelude: the structure's upkeep, shared by every rw script
-- (spliced in where a script says `--@include _kinds/rw/common`).
--
-- The structure of one name (see aiolock/_kinds/rw.py for the whole wire format):
--   hash   {hold field -> hold count, 'writer' -> the write hold's field,
--           'writer_owner' -> the owner id of the task holding the write side,
--           'writer_attempt' -> the void key of the attempt the write hold belongs to}
--   leases zset {hold field -> end of that hold's lease, ms of the server clock}
--   claims zset {waiting writer's field -> end of its claim, ms of the server clock}
-- Every hold (read or write) has its own lease in `leases`; the hash and `leases` expire
-- (PEXPIRE) at the latest lease, so a name nobody holds leaves nothing behind. Holds
-- whose lease ended (a crashed owner) are purged by every script before it decides.

-- The server's clock in ms: every expiry stored as data is on this clock, never a
-- client's.
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- {-1, type, key} if `hash` is not a hash or one of the zsets not a zset, else nil.
local function wrong_type(hash, ...)
  local t = redis.call('type', hash).ok
  if t ~= 'none' and t ~= 'hash' then
    return {-1, t, hash}
  end
  for _, key in ipairs({...}) do
    t = redis.call('type', key).ok
    if t ~= 'none' and t ~= 'zset' then
      return {-1, t, key}
    end
  end
  return nil
end

-- Forget the holds whose lease ended at or before `now` (their owners are gone).
local function purge(hash, leases, now)
  local gone = redis.call('zrangebyscore', leases, '-inf', now)
  if #gone == 0 then
    return
  end
  local writer = redis.call('hget', hash, 'writer')
  for _, field in ipairs(gone) do
    redis.call('hdel', hash, field)
    if field == writer then
      redis.call('hdel', hash, 'writer', 'writer_owner', 'writer_attempt')
    end
  end
  redis.call('zremrangebyscore', leases, '-inf', now)
end

-- Forget the claims of waiting writers that stopped refreshing them (crashed).
local function purge_claims(claims, now)
  redis.call('zremrangebyscore', claims, '-inf', now)
end

-- Expire the hash and `leases` at the latest lease, or delete them if no hold is left.
local function settle(hash, leases, now)
  local last = redis.call('zrange', leases, -1, -1, 'withscores')
  if #last == 0 then
    redis.call('del', hash, leases)
    return
  end
  local ttl = tonumber(last[2]) - now
  redis.call('pexpire', hash, ttl)
  redis.call('pexpire', leases, ttl)
end

-- Drop one hold entirely; true if it was the write hold.
local function drop(hash, leases, field)
  local was_writer = redis.call('hget', hash, 'writer') == field
  redis.call('hdel', hash, field)
  redis.call('zrem', leases, field)
  if was_writer then
    redis.call('hdel', hash, 'writer', 'writer_owner', 'writer_attempt')
  end
  return was_writer
end

-- Milliseconds until the first entry of zset `key` ends, or nil if it has none.
local function first_end(key, now)
  local first = redis.call('zrange', key, 0, 0, 'withscores')
  if #first == 0 then
    return nil
  end
  return math.max(tonumber(first[2]) - now, 1)
end
