-- aiolock: acquire a reentrant lock, or re-enter one the owner already holds.
--
-- KEYS[1]  lock hash: {owner field -> hold count}; one owner at a time
-- KEYS[2]  meta hash: {fence -> last fencing token, released -> id of the last final release}
-- KEYS[3]  void marker of this attempt: present if the attempt was cancelled in flight
-- ARGV[1]  owner field
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  hold count the client believes it has (0 for a new acquisition)
-- ARGV[4]  lifetime of the meta hash in milliseconds
-- ARGV[5]  the acquiring manager's id
--
-- Returns {code, value}:
--   { 1, token}  acquired anew; token is the new fencing token
--   { 2, count}  re-entered; count is the new hold count
--   { 0, pttl }  held by another owner; pttl is its remaining lease in ms (-1: none);
--               or free, but this manager yields to other clients for pttl ms more
--   { 3, 0    }  voided: a cancel reached Redis before this attempt did; nothing done
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--   {-2, type }  KEYS[2] likewise
--
-- A retried command (redis-py resends after a dropped connection) finds the hold count
-- already at ARGV[3] + 1 and answers as the first run did instead of counting twice.

if redis.call('exists', KEYS[3]) == 1 then
  return {3, 0}
end

local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then
  -- One read of the meta hash; pcall turns a key of another type into an answer.
  local yield_field = 'yield:' .. ARGV[5]
  local meta = redis.pcall('hmget', KEYS[2], 'fence', 'turns', yield_field)
  if meta.err then
    if string.find(meta.err, 'WRONGTYPE', 1, true) then
      return {-2, redis.call('type', KEYS[2]).ok}
    end
    return redis.error_reply(meta.err)  -- e.g. an ACL refusal: not ours to hide
  end
  local last = tonumber(meta[1] or 0)
  local turns = tonumber(meta[2] or 0)
  local now = redis.call('time')
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  -- A manager that released while others listened yields ('yield:<id>' =
  -- '<until, us>:<turn>'): it stays off until the other listeners had a turn each (the
  -- 'turns' counter reached <turn>) or, if some of them do not come, until <until>.
  if meta[3] then
    local sep = string.find(meta[3], ':', 1, true)
    local yield_until = tonumber(string.sub(meta[3], 1, sep - 1))
    if now_us < yield_until and turns < tonumber(string.sub(meta[3], sep + 1)) then
      return {0, math.ceil((yield_until - now_us) / 1000)}
    end
    redis.call('hdel', KEYS[2], yield_field)
  end
  -- Fencing token: the server's clock in microseconds, forced above the last token of
  -- this name, so tokens keep increasing even after the meta hash expired or the server
  -- restarted without persistence (as long as its clock is not set back).
  local token = now_us
  if token <= last then
    token = last + 1
  end
  redis.call('hset', KEYS[2], 'fence', string.format('%.0f', token), 'turns', turns + 1)
  redis.call('pexpire', KEYS[2], ARGV[4])
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, token}
end
if kind ~= 'hash' then
  return {-1, kind}
end

local count = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
if count == 0 then
  return {0, redis.call('pttl', KEYS[1])}
end
if count ~= tonumber(ARGV[3]) + 1 then
  count = redis.call('hincrby', KEYS[1], ARGV[1], 1)
end
redis.call('pexpire', KEYS[1], ARGV[2])
if count == 1 then
  -- A retried new acquisition: hand back the token the first run produced.
  return {1, tonumber(redis.call('hget', KEYS[2], 'fence'))}
end
return {2, count}
