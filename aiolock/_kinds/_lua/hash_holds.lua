-- aiolock prelude: renewal of holds kept as fields of a hash (owner field -> hold count),
-- the fair lock's and the 'redisson' wire's (spliced in by the loader where a script says
-- `--@include _kinds/_lua/hash_holds`). The lock kept its holds so until issue 21.
--
-- renew_hash_holds() -> one entry per KEYS[i]: 1 if the owner field ARGV[2i-1] still holds
--     that hash (and its lease was set to ARGV[2i] ms, unless '0': a fixed-lease hold is
--     only checked), 0 if not (expired, force-released, evicted, or the key was replaced
--     by another type).
-- extend_hash_hold() -> the lease left after adding ARGV[2] ms to KEYS[1]'s, if the field
--     ARGV[1] holds it, else 0. Reading PTTL and setting it in one script is what makes it
--     an addition: read and set from the client, the lease could end, or be set by
--     another call, in between.

local function renew_hash_holds()
  local held = {}
  for i = 1, #KEYS do
    if redis.pcall('hexists', KEYS[i], ARGV[2 * i - 1]) == 1 then
      if ARGV[2 * i] ~= '0' then
        redis.call('pexpire', KEYS[i], ARGV[2 * i])
      end
      held[i] = 1
    else
      held[i] = 0
    end
  end
  return held
end

local function extend_hash_hold()
  if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then
    return 0
  end
  local left = redis.call('pttl', KEYS[1])
  if left < 0 then
    left = 0  -- no TTL (PERSISTed from outside): the lease becomes what is added
  end
  local lease = left + tonumber(ARGV[2])
  redis.call('pexpire', KEYS[1], lease)
  return lease
end
