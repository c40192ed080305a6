-- aiolock token lock (wire="token"): acquire, or confirm a re-entry of, a lock shared
-- with clients of the SET NX PX + compare-and-delete recipe (redis-py's Lock and others).
--
-- KEYS[1]  the lock: a string at the lock name itself, holding its holder's token
-- KEYS[2]  void marker of this attempt: present if an undo got there first
-- ARGV[1]  this acquisition's token (aiolock's: 'aiolock:{<prefix>}:<owner field>')
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  '0' for a new acquisition; otherwise a re-entry of the hold ARGV[1]
--
-- Returns 1 if the caller holds the lock now (acquired, re-entered, or a resend of an
-- attempt that already ran), with its lease set to ARGV[2]; else
--   {0, token, pttl}  held by another: the holder's token and its remaining lease in ms
--                     (-1: no expiry; -2 and token '': free, but a re-entry found its
--                     own hold gone, so it does not take the lock anew)
--   {3}               voided: an undo reached Redis before this attempt did
--   {-1, type}        KEYS[1] holds a value of another Redis type; nothing done
--
-- The new acquisition is exactly what the recipe's SET NX PX does (a script only to
-- honour the void marker): another client sees the same string and expiry.

if redis.call('exists', KEYS[2]) == 1 then
  return {3}
end
local held = redis.pcall('get', KEYS[1])
if type(held) == 'table' and held.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
if held == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
if not held then
  if ARGV[3] ~= '0' then
    return {0, '', -2}
  end
  redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
  return 1
end
return {0, held, redis.call('pttl', KEYS[1])}
