-- aiolock 'redisson' wire format: renew or check many holds in one round trip (also used by extend).
--
-- KEYS[i]      lock hash i: {owner field -> hold count}
-- ARGV[2i-1]   owner field that should hold KEYS[i]
-- ARGV[2i]     new lease in milliseconds, or '0' to check the hold without extending it
--              (fixed-lease holds: the watchdog only makes sure Redis still has them)
--
-- Returns an array with one entry per key: 1 if that owner still holds the lock (and
-- its lease was renewed if asked), 0 if not (expired, force-released, evicted, or the
-- key was replaced by another type). On Redis Cluster a batch must not span slots: the
-- watchdog then groups holds by slot (a single server takes any mix).
--@include _kinds/_lua/hash_holds

return renew_hash_holds()
