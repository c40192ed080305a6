-- aiolock fair lock: undo an acquire attempt whose outcome is unknown (cancelled or
-- failed in flight), or withdraw a waiter that gives up.
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  void marker of the attempt (the acquire script's KEYS[3])
-- KEYS[3]  queue zset: {waiter field -> arrival number} (see fair/queue.lua)
-- KEYS[4]  claims zset: {waiter field -> claim expiry, server ms}
-- ARGV[1]  owner field
-- ARGV[2]  hold count the owner had before the attempt
-- ARGV[3]  lifetime of the void marker in milliseconds
-- ARGV[4]  claim_ttl in milliseconds: the pickup lease of the next waiter's grant
-- The release channel is KEYS[1] .. ':released'.
--
-- The waiter leaves the queue at once. Returns 1 if the attempt had run and won the
-- lock (or a release had granted it to this waiter): a new hold is then released and
-- the lock granted to the next live waiter (whose field is published), a re-entry
-- uncounted. Returns 0 otherwise. Either way the void marker is set first: it makes
-- sure the attempt, if it has not run yet (or the client resent it), never does (and so
-- never queues the waiter again).
-- (A grant looks like a pickup that ran -- count 1 -- so a return of 1 does not prove
-- that the attempt ran: a pickup delayed behind its undo must be voided too.)
--@include _kinds/fair/queue
--@include _kinds/_lua/tombstone

void_attempt(KEYS[2], ARGV[3])
leave(KEYS[3], KEYS[4], ARGV[1])
local before = tonumber(ARGV[2])
local count = redis.pcall('hget', KEYS[1], ARGV[1])
if type(count) ~= 'table' and tonumber(count or 0) == before + 1 then
  if before == 0 then
    redis.call('del', KEYS[1])
    grant_next(KEYS[1], KEYS[3], KEYS[4], now_ms(), ARGV[4], KEYS[1] .. ':released')
  else
    redis.call('hset', KEYS[1], ARGV[1], before)
  end
  return 1
end
return 0
