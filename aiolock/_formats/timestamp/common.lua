-- aiolock timestamp lock (wire="timestamp"): helpers shared by its scripts.
--
-- The lock is a string at the lock name holding the holder's expiry time, in ms since
-- the Unix epoch: the legacy SETNX/GETSET protocol, which has no owner identity. aiolock
-- records which of its holds wrote the current value in its own key, the *holder
-- record* '<value> <owner field>', which lives exactly as long as that value is in the
-- future. A hold is "ours" while the lock holds the value of the record and the record
-- names the hold's field. aiolock's scripts read the clock of the Redis server (TIME);
-- legacy clients compare with their own clocks.

-- The server's clock in ms since the Unix epoch.
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether the lock value *held* (a string or false) was written by the hold *field*,
-- according to the holder record *record* (a string or false).
local function written_by(held, record, field)
  return held and record and record == held .. ' ' .. field
end

-- Store a new expiry for the hold *field*: now + lease; the lock key and the holder
-- record expire when it does (a legacy client would find it stale then anyway).
local function write(lock, record_key, field, now, lease)
  local value = string.format('%.0f', now + tonumber(lease))
  redis.call('set', lock, value, 'px', lease)
  redis.call('set', record_key, value .. ' ' .. field, 'px', lease)
  return value
end
