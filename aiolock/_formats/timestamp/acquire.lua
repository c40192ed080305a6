-- aiolock timestamp lock (wire="timestamp"): acquire, or confirm a re-entry of, a lock
-- shared with clients of the legacy SETNX/GETSET protocol (the value is an expiry time).
--
-- KEYS[1]  the lock: a string at the lock name, holding its holder's expiry (epoch ms)
-- KEYS[2]  aiolock's holder record (see common.lua)
-- KEYS[3]  void marker of this attempt: present if an undo got there first
-- ARGV[1]  owner field of this acquisition
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  '0' for a new acquisition; otherwise a re-entry of the hold ARGV[1]
--
-- Returns {1, value} if the caller holds the lock now (acquired, re-entered, or a resend
-- of an attempt that already ran), having written the expiry 'value' = server time +
-- ARGV[2]; else
--   {0, ttl, aiolock}  held by another: ms until its stored expiry (-1: the value is
--                      not a number), and 1 if an aiolock client of this prefix holds
--                      it (it announces its release), else 0; a re-entry whose hold
--                      is gone answers {0, -2, 1} (as PTTL for no key) and takes nothing
--   {3}                voided: an undo reached Redis before this attempt did
--   {-1, type}         KEYS[1] holds a value of another Redis type; nothing done
--
-- What the legacy client does in three round trips (SETNX; else GET and, if the stored
-- expiry has passed, GETSET and a check that it swapped out the value it saw) happens
-- here in one atomic step, so the check always succeeds; what other clients see is the
-- same: a new expiry written over an absent or stale one.
--@include _formats/timestamp/common

if redis.call('exists', KEYS[3]) == 1 then
  return {3}
end
local held = redis.pcall('get', KEYS[1])
if type(held) == 'table' and held.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
local record = redis.call('get', KEYS[2])
local now = now_ms()
if written_by(held, record, ARGV[1]) then
  return {1, write(KEYS[1], KEYS[2], ARGV[1], now, ARGV[2])}
end
if ARGV[3] ~= '0' then
  return {0, -2, 1}
end
if held then
  local expiry = tonumber(held)
  if expiry == nil then
    return {0, -1, 0}
  end
  if expiry >= now then
    local ours = record and string.sub(record, 1, #held + 1) == held .. ' '
    return {0, expiry - now, ours and 1 or 0}
  end
end
return {1, write(KEYS[1], KEYS[2], ARGV[1], now, ARGV[2])}
