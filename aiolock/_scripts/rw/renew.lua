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
--@include rw/common

local now = now_ms()
local held = {}
local touched = {}  -- hash -> leases: structures whose expiry must follow the new leases
local checked = {}  -- hash -> true if its keys have the right types
for i = 1, #KEYS / 2 do
  local hash, leases, field = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1]
  if checked[hash] == nil then
    checked[hash] = wrong_type(hash, leases) == nil
    if checked[hash] then
      purge(hash, leases, now)
    end
  end
  held[i] = 0
  if checked[hash] and redis.call('zscore', leases, field) then
    if ARGV[2 * i] ~= '0' then
      redis.call('zadd', leases, now + tonumber(ARGV[2 * i]), field)
      touched[hash] = leases
    end
    held[i] = 1
  end
end
for hash, leases in pairs(touched) do
  settle(hash, leases, now)
end
return held
