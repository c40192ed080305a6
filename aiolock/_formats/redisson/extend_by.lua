-- aiolock 'redisson' wire format: add time to one hold's remaining lease in one step
-- (extend(additional=...)).
--
-- KEYS[1]   lock hash: {owner field -> hold count}
-- ARGV[1]   owner field that should hold KEYS[1]
-- ARGV[2]   milliseconds to add to the lease left (a positive integer)
--
-- Returns the lease left after the addition in milliseconds, or 0 if that owner no longer
-- holds the lock (expired, force-released, evicted, or the key replaced by another type).
--@include _kinds/_lua/hash_holds

return extend_hash_hold()
