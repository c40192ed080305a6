-- aiolock rw: renew or check many holds (of either side) in one round trip; also extend.
--
-- KEYS[2i-1]   hash of hold i: {hold field -> count, 'writer' -> ..., 'writer_owner' -> ...}
-- KEYS[2i]     leases zset of hold i: {hold field -> lease end, server ms}
-- ARGV[2i-1]   hold field i
-- ARGV[2i]     its new lease in milliseconds, or '0' to check it without extending it
--
-- Returns an array with one entry per hold: 1 if Redis still has it (and its lease was
-- set anew if asked), 0 if not (its lease ended, it was force-released or evicted, or a
-- key was replaced by another type). Each hold's lease is its own: setting it never
-- touches another reader's. On Redis Cluster a batch must not span slots.
--
-- Cost (issue 24): the watchdog sends a few hundred holds per call, so the work per
-- renewed hold is ZSCORE and ZADD, and per structure of the batch one PEXPIRE ... GT of
-- the hash, plus one of `leases` when it took; the reasoning is semaphore/renew.lua's
-- (every script changes the hash and `leases` together, and the hash always has a TTL,
-- so a PEXPIRE GT that takes shows the hash intact; when it does not, each hold's field
-- is looked up in the hash and the lifetime is set from the latest lease, as before).
-- Holds of others whose lease ended are left for the next acquire or release to purge
-- (each purges before it decides): this script only needs to see that the renewed
-- hold's own lease has not ended.
--@include _kinds/rw/common

local now = now_ms()
local held = {}
local touched = {}  -- hash -> {leases, the longest lease set this call, hold indexes}
for i = 1, #KEYS / 2 do
  local hash, leases, field = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1]
  local lease = tonumber(ARGV[2 * i])
  local ends = redis.pcall('zscore', leases, field)
  held[i] = 0
  if type(ends) == 'string' and tonumber(ends) > now then
    if lease == 0 then
      if redis.pcall('hexists', hash, field) == 1 then
        held[i] = 1
      end
    else
      redis.call('zadd', leases, now + lease, field)
      held[i] = 1
      local seen = touched[hash]
      if seen == nil then
        touched[hash] = {leases, lease, {i}}
      else
        seen[2] = math.max(seen[2], lease)
        seen[3][#seen[3] + 1] = i
      end
    end
  end
end
for hash, seen in pairs(touched) do
  if redis.call('pexpire', hash, seen[2], 'GT') == 1 then
    redis.call('pexpire', seen[1], seen[2])
  else
    for _, i in ipairs(seen[3]) do
      if redis.pcall('hexists', hash, ARGV[2 * i - 1]) ~= 1 then
        held[i] = 0
      end
    end
    if redis.call('type', hash).ok == 'hash' then
      settle(hash, seen[1], now)
    end
  end
end
return held
