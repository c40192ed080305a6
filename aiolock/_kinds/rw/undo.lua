-- aiolock rw: undo an acquire attempt of either side whose outcome is unknown (cancelled
-- or failed in flight), or withdraw a waiting writer's claim when it gives up.
--
-- KEYS[1]  hash: {hold field -> count, 'writer' -> field, 'writer_owner' -> owner id,
--          'writer_attempt' -> the void key of the attempt the write hold belongs to}
-- KEYS[2]  leases zset: {hold field -> lease end, server ms}
-- KEYS[3]  claims zset: {waiting writer's field -> claim end, server ms}
-- KEYS[4]  void marker of the attempt (the acquire script's KEYS[5])
-- ARGV[1]  hold field (a waiting writer's claim field)
-- ARGV[2]  hold count the owner had before the attempt
-- ARGV[3]  lifetime of the void marker in milliseconds
-- ARGV[4]  message to publish (the manager's id)
--
-- Returns 1 if something changed that may let a waiter in (the attempt had run and was
-- undone, or a claim was withdrawn): the release message is then published; else 0.
-- Either way the void marker is set: a copy of the attempt still on its way (or resent
-- by the client) does nothing when it arrives.

local hash, leases, claims, field = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local before = tonumber(ARGV[2])
--@include _kinds/rw/common
--@include _kinds/_lua/tombstone

local bad = wrong_type(hash, leases, claims)
if bad then
  return bad
end
void_attempt(KEYS[4], ARGV[3])
local now = now_ms()
purge(hash, leases, now)
purge_claims(claims, now)

local changed = redis.call('zrem', claims, field)
local count = redis.call('hget', hash, field)
local ran = tonumber(count or 0) == before + 1
if ran and before == 0 and redis.call('hget', hash, 'writer') == field
    and redis.call('hget', hash, 'writer_attempt') ~= KEYS[4] then
  -- A writer's field serves every attempt of its wait: this write hold belongs to a
  -- later attempt (granted after this one's outcome was lost), not to this one.
  ran = false
end
if ran then
  if before == 0 then
    drop(hash, leases, field)
    settle(hash, leases, now)
  else
    redis.call('hset', hash, field, before)
  end
  changed = 1
end
if changed == 1 and before == 0 then
  redis.call('publish', hash .. ':released', ARGV[4])
end
return changed
