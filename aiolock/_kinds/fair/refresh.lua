-- aiolock fair lock: keep live waiters' claims from expiring, and keep the queue moving.
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  queue zset: {waiter field -> arrival number} (see fair/queue.lua)
-- KEYS[3]  claims zset: {waiter field -> claim expiry, server ms}
-- ARGV[1]  claim_ttl in milliseconds
-- ARGV[2..] fields of this client's waiters
--
-- Sent by each client with waiters every claim_ttl / 3. A field still queued gets its
-- claim set to now + claim_ttl; a field no longer queued (granted, withdrawn, or
-- dropped) is left alone: a refresh never queues anyone. Waiters whose claims expired
-- (their processes died) are dropped, so they leave the queue within claim_ttl plus
-- claim_ttl / 3 even while the lock stays held. Then, if the lock is free
-- (its holder's lease, or a dead waiter's pickup lease, ran out without a release), the
-- lock is granted to the first live waiter and its field published, so the queue never
-- waits longer than claim_ttl / 3 after a lease lapses.
-- Returns the field granted, or '' if none.
--@include _kinds/fair/queue

local now = now_ms()
local queued = false
for i = 2, #ARGV do
  if redis.call('zscore', KEYS[2], ARGV[i]) then
    redis.call('zadd', KEYS[3], now + tonumber(ARGV[1]), ARGV[i])
    queued = true
  end
end
if queued then
  redis.call('pexpire', KEYS[2], ARGV[1])
  redis.call('pexpire', KEYS[3], ARGV[1])
end
purge(KEYS[2], KEYS[3], now)
if redis.call('exists', KEYS[1]) == 0 then
  return grant_next(KEYS[1], KEYS[2], KEYS[3], now, ARGV[1], KEYS[1] .. ':released')
end
return ''
