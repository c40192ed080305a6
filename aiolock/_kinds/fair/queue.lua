-- aiolock fair lock prelude: the waiters' queue (spliced in by `--@include _kinds/fair/queue`).
--
-- The queue of one fair lock is two sorted sets with the same members, the fields of
-- the waiting acquisitions:
--   queue   field -> arrival number (1, 2, ...: the order in which waiters reached Redis)
--   claims  field -> expiry of the waiter's registration, in server-time milliseconds
-- A waiter's process refreshes its claims every claim_ttl / 3; a claim not refreshed
-- expires, and its waiter is dropped by the next script that looks at the queue.
--
-- now_ms()                       the server's clock in milliseconds (never a client's)
-- purge(queue, claims, now)      drop the waiters whose claims expired
-- register(queue, claims, field, now, claim_ms)
--                                put field at the tail unless it is queued already, and
--                                (re)set its claim to now + claim_ms
-- leave(queue, claims, field)    take field out of the queue
-- grant_next(lock, queue, claims, now, claim_ms, channel)
--                                the lock is free: grant it to the first live waiter
--                                (hold count 1, a pickup lease of claim_ms) and publish
--                                that waiter's field on channel; returns the field, or
--                                '' (and publishes nothing) if nobody waits

local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function leave(queue, claims, field)
  redis.call('zrem', queue, field)
  redis.call('zrem', claims, field)
end

local function purge(queue, claims, now)
  local dead = redis.call('zrangebyscore', claims, '-inf', now)
  for i = 1, #dead do
    leave(queue, claims, dead[i])
  end
end

local function register(queue, claims, field, now, claim_ms)
  if not redis.call('zscore', queue, field) then
    local last = redis.call('zrange', queue, -1, -1, 'withscores')
    local number = 1
    if last[2] then
      number = tonumber(last[2]) + 1
    end
    redis.call('zadd', queue, number, field)
  end
  redis.call('zadd', claims, now + tonumber(claim_ms), field)
  -- Every claim ends by now + claim_ms at the latest: so may the keys.
  redis.call('pexpire', queue, claim_ms)
  redis.call('pexpire', claims, claim_ms)
end

local function grant_next(lock, queue, claims, now, claim_ms, channel)
  purge(queue, claims, now)
  local head = redis.call('zrange', queue, 0, 0)[1]
  if not head then
    return ''
  end
  leave(queue, claims, head)
  redis.call('hset', lock, head, 1)
  redis.call('pexpire', lock, claim_ms)
  redis.call('publish', channel, head)
  return head
end
