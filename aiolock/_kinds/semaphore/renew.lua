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
-- Cost (issue 24): the watchdog sends a hundred or more permits per call, often one per
-- semaphore, so the work per renewed permit is ZSCORE and ZADD, and per semaphore of the
-- batch (the first of its permits, and any later one with a longer lease) one
-- PEXPIRE ... GT of H, then one PEXPIRE of E and one PEXPIRE ... GT of the limit key
-- (keep_limit) when it took: five commands for a semaphore with one permit, no table
-- per permit. The scripts change H and E together (a field is in both or in neither),
-- so H's field needs no HEXISTS of its own while H is intact: PEXPIRE GT takes only on
-- an existing key with a TTL, and H always has one. When it does not take (H gone or
-- replaced by a value without TTL, another holder's lease ends later, or an extend
-- shortened this one), each permit's field of that H is looked up in H and the keys'
-- lifetime is set from the latest lease in E at the end, as before.
--@include _kinds/_lua/permits

local now = math.floor(now_us() / 1000)
local held = {}
-- H -> the longest lease its PEXPIRE GT took with in this call, or false: it did not
-- take for H's first permit here (H is checked per permit, and settled at the end)
local set = {}
local settle = nil  -- H -> {E, L} of the holders settled at the end
for i = 1, #KEYS / 3 do
  local H, E = KEYS[3 * i - 2], KEYS[3 * i - 1]
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
      local took = set[H]
      if took == nil or (took and lease > took) then
        if redis.call('pexpire', H, lease, 'GT') == 1 then
          set[H] = lease
          redis.call('pexpire', E, lease)
          keep_limit(KEYS[3 * i], lease)
        elseif took == nil then
          -- (after a take in this call, a refused longer lease cannot happen: the
          -- server's clock stands still within a script)
          took = false
          set[H] = false
          if settle == nil then
            settle = {}
          end
          settle[H] = {E, KEYS[3 * i]}
        end
      end
      if took == false and redis.pcall('hexists', H, field) ~= 1 then
        held[i] = 0
      end
    end
  end
end
if settle ~= nil then
  for H, keys in pairs(settle) do
    if redis.call('type', H).ok == 'hash' then
      expire_holders(H, keys[1], now, keys[2])
    end
  end
end
return held
