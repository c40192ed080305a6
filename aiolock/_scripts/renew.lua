-- aiolock: renew the leases of many held locks in one round trip (also used by extend).
--
-- KEYS[i]    lock hash i: {owner field -> hold count}
-- ARGV[1]    lease in milliseconds, the same for every lock in the batch
-- ARGV[i+1]  owner field that should hold KEYS[i]
--
-- Returns an array with one entry per key: 1 if the lease was renewed, 0 if that owner
-- no longer holds the lock (expired, force-released, or the key was replaced).
-- A batch never spans Redis Cluster slots: the caller groups keys by slot.

local renewed = {}
for i = 1, #KEYS do
  if redis.call('type', KEYS[i]).ok == 'hash'
      and redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
