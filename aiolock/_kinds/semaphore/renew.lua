-- aiolock semaphore: renew or check many permits in one round trip (also extend).
--
-- KEYS[3i-2]  holders hash H of permit i (see acquire.lua)
-- KEYS[3i-1]  holders' expiry zset E of permit i
-- KEYS[3i]    limit key L of permit i's semaphore (lives as long as H: permits.lua)
-- ARGV[2i-1]  permit field i
-- ARGV[2i]    new lease in milliseconds from now, or '0' to check without extending
--
-- Returns an array with one entry per permit: 1 if it is still held (lease not ended on
-- the server's clock; renewed if asked), 0 if not (expired, reclaimed, force-released,
-- or a key replaced by another type). An ended lease is never revived: another client
-- may have counted those permits as free.
--
-- Cost (issue 24): the watchdog sends up to a hundred or more permits per call, so the
-- work per renewed permit is ZSCORE and ZADD, and per semaphore of the batch one PEXPIRE
-- ... GT of H, plus one of E and the limit key's when it took. The scripts change H and
-- E together (a field is in both or in neither), so H's field needs no HEXISTS of its
-- own while H is intact: PEXPIRE GT takes only on an existing key with a TTL, and H
-- always has one. When it does not take (H gone or replaced by a value without TTL,
-- another holder's lease ends later, or an extend shortened this one), each permit's
-- field is looked up in H and the keys' lifetime is set from the latest lease in E, as
-- before.
--@include _kinds/_lua/permits

local now = math.floor(now_us() / 1000)
local held = {}
local touched = {}  -- H -> {E, the longest lease set this call, permit indexes, L}
for i = 1, #KEYS / 3 do
  local H, E, L = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local field, lease = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local expiry = redis.pcall('zscore', E, field)
  held[i] = 0
  if type(expiry) == 'string' and tonumber(expiry) > now then
    if lease == 0 then
      if redis.pcall('hexists', H, field) == 1 then
        held[i] = 1
      end
    else
      redis.call('zadd', E, now + lease, field)
      held[i] = 1
      local seen = touched[H]
      if seen == nil then
        touched[H] = {E, lease, {i}, L}
      else
        seen[2] = math.max(seen[2], lease)
        seen[3][#seen[3] + 1] = i
      end
    end
  end
end
for H, seen in pairs(touched) do
  if redis.call('pexpire', H, seen[2], 'GT') == 1 then
    redis.call('pexpire', seen[1], seen[2])
    keep_limit(seen[4], seen[2])
  else
    for _, i in ipairs(seen[3]) do
      if redis.pcall('hexists', H, ARGV[2 * i - 1]) ~= 1 then
        held[i] = 0
      end
    end
    if redis.call('type', H).ok == 'hash' then
      expire_holders(H, seen[1], now, seen[4])
    end
  end
end
return held
