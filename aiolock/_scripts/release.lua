-- aiolock: release one hold of a reentrant lock; on the last one, wake or hand over.
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  meta hash: {fence -> last fencing token, released -> id of the last final release}
-- ARGV[1]  owner field
-- ARGV[2]  hold count the client has before this release (>= 1); 1 = the last hold
-- ARGV[3]  release id, unique per final release ('-' for a nested one); no spaces
-- ARGV[4]  release channel
-- ARGV[5]  message to publish (the releasing manager's id)
-- ARGV[6]  lifetime of the meta hash in milliseconds
-- ARGV[7]  owner field of a local successor to hand the lock to, or '' for none
-- ARGV[8]  the successor's lease in milliseconds
-- ARGV[9]  fairness window in microseconds (see below)
-- ARGV[10] hand-overs in a row allowed while other clients listen (see below)
-- ARGV[11] '1' if the releasing manager itself listens on the channel, else '0'
--
-- Returns {code, value}:
--   { 1, count}  one hold released, still held; count holds are left
--   { 2, n    }  released: key deleted (and a message published if anyone listens);
--                n = 1 if other clients listen (the releaser's manager then yields)
--   { 4, token}  handed over: the successor now holds the lock with this fencing token
--   { 0, 0    }  this owner does not hold the lock
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- Fairness between clients: while other clients listen on the channel (PUBSUB NUMSUB
-- minus the releaser's own subscription, ARGV[11]), at most ARGV[10] hand-overs in a
-- row stay within one manager (counted in the meta hash's 'streak'); then the release
-- publishes instead, and the meta hash records (field 'yield:<manager id>') that the
-- releasing manager yields: the acquire script refuses its tasks until each other
-- listener has had a turn (acquisitions by the acquire script are counted in 'turns'),
-- or at most ARGV[9] microseconds, so the waiters the message wakes elsewhere get in.
-- With nobody listening elsewhere, hand-overs are unlimited.
--
-- Idempotent, so a resent command is harmless: the count is set to the client's count
-- minus one (not decremented again), and a final release leaves its id in the meta hash
-- (the last few are kept), so a resend finds the key gone or handed over and answers as
-- the first run did.

local kind = redis.call('type', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then
  return {-1, kind}
end

local count = 0
if kind == 'hash' then
  count = tonumber(redis.call('hget', KEYS[1], ARGV[1]) or 0)
end
if count == 0 then
  -- A resend of a final release that already ran finds its id among the recent ones.
  local recent = redis.call('type', KEYS[2]).ok == 'hash'
    and redis.call('hget', KEYS[2], 'released')
  if ARGV[3] ~= '-' and recent and string.find(recent, ' ' .. ARGV[3] .. ' ', 1, true) then
    if ARGV[7] ~= '' and redis.call('hexists', KEYS[1], ARGV[7]) == 1 then
      return {4, tonumber(redis.call('hget', KEYS[2], 'fence'))}
    end
    return {2, 0}
  end
  return {0, 0}
end

local left = tonumber(ARGV[2]) - 1
if left > 0 then
  redis.call('hset', KEYS[1], ARGV[1], left)
  return {1, left}
end

redis.call('del', KEYS[1])
-- One read of the meta hash; a key of another type there is ours by name: replace it.
local meta = redis.pcall('hmget', KEYS[2], 'released', 'streak', 'fence', 'turns')
if meta.err then
  if not string.find(meta.err, 'WRONGTYPE', 1, true) then
    return redis.error_reply(meta.err)  -- e.g. an ACL refusal: not ours to hide
  end
  redis.call('del', KEYS[2])
  meta = {false, false, false, false}
end
-- Remember the ids of the last few final releases (a space-separated list), so that a
-- resend is recognised even after other owners came and went in the meantime.
local recent = meta[1] or ' '
if string.len(recent) > 1500 then
  recent = string.sub(recent, string.find(recent, ' ', 500, true))
end
recent = recent .. ARGV[3] .. ' '
local streak = tonumber(meta[2] or 0)
local others = redis.call('pubsub', 'numsub', ARGV[4])[2] - tonumber(ARGV[11])

if ARGV[7] ~= '' and (others <= 0 or streak < tonumber(ARGV[10])) then
  -- Same token rule as the acquire script: the server's clock in microseconds, forced
  -- above the last token of this name.
  local now = redis.call('time')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(meta[3] or 0)
  if token <= last then
    token = last + 1
  end
  redis.call('hset', KEYS[2], 'released', recent, 'streak', streak + 1,
    'fence', string.format('%.0f', token))
  redis.call('pexpire', KEYS[2], ARGV[6])
  redis.call('hset', KEYS[1], ARGV[7], 1)
  redis.call('pexpire', KEYS[1], ARGV[8])
  return {4, token}
end

if others > 0 then
  local now = redis.call('time')
  local until_us = tonumber(now[1]) * 1000000 + tonumber(now[2]) + tonumber(ARGV[9])
  local turn = tonumber(meta[4] or 0) + others
  redis.call('hset', KEYS[2], 'released', recent, 'streak', 0,
    'yield:' .. ARGV[5], string.format('%.0f:%d', until_us, turn))
  redis.call('pexpire', KEYS[2], ARGV[6])
  redis.call('publish', ARGV[4], ARGV[5])
  return {2, 1}
end
redis.call('hset', KEYS[2], 'released', recent, 'streak', 0)
if not (meta[1] or meta[2] or meta[3] or meta[4]) then
  redis.call('pexpire', KEYS[2], ARGV[6])  -- created just now; else acquire set its life
end
if ARGV[11] == '1' then
  redis.call('publish', ARGV[4], ARGV[5])  -- only this manager listens; nobody else to tell
end
return {2, 0}
