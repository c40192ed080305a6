-- aiolock prelude: the marks a release or an undo leaves so that a resent command (its
-- reply lost with a dropped connection) answers as the first run did, shared by every
-- kind's scripts (spliced in by the loader where a script says `--@include _kinds/_lua/tombstone`).
--
-- The tombstone of a final release: a string key of that release's own (a KEYS entry
-- the client derives from the hold, so a resend names the same key), set by the run that
-- ended the hold for the tombstone lifetime the client passes (an ARGV entry, in ms). A
-- release that finds no hold of its owner reads it: present, a first run ended the hold
-- and the resend answers as that one did, however many owners came and went in between;
-- absent, the hold was lost (its lease ran out, it was force-released or taken over).
-- The value says how the release ended: the kind's `released` mark ('1' unless the kind
-- says otherwise), or, where a release may hand the lock to a local successor, `handed`
-- followed by the successor's fencing token.
--
-- The void marker of an acquire attempt whose outcome is unknown: set by its undo,
-- whatever the undo finds, for a lifetime the client passes (longer than any delayed
-- attempt). The acquire script checks it first and does nothing. The undo goes out on
-- another connection than the attempt, so Redis may run it first (the attempt still on
-- its way), or between two copies of the attempt (the client resent it after a dropped
-- connection; the undo reverted the first copy): either way no copy may grant anything
-- after the undo ran. The rule of every compensation (issue 36; docs/reliability.md).
--
-- leave_tombstone(tomb, ttl_ms, mark)
--     the final release ended the hold: tombstone `tomb` with `mark` ('1' if nil)
-- hand_over(lock, successor, lease_ms, token, tomb, ttl_ms, handed)
--     the final release gives the lock hash `lock` to `successor` (hold count 1, lease
--     lease_ms) with fencing token `token`, and tombstones `tomb` with `handed` .. token;
--     returns the release's reply {4, token}
-- resend_reply(tomb, lock, successor, released, handed)
--     the reply of a release that found no hold of its owner: {0, 0} without a
--     tombstone; {4, token} if the first run handed the lock over and `successor` (given
--     and not '') holds it still; else {2, 0}. Kinds without hand-over pass `tomb`
--     alone (its value is then never read).
-- void_attempt(key, ttl_ms)
--     set the void marker `key` of an attempt
-- release_count(lock, field, count, tomb, successor, released, handed)
--     the first step of releasing a hold kept as a count in a hash field (Redisson's
--     layout; the lock's until issue 21): a reply when the release ends here ({-1, type} for a key of
--     another type, resend_reply's answer when the hold is gone, {1, left} for a nested
--     release, which writes the count left), or nil when this is the final release

local function leave_tombstone(tomb, ttl_ms, mark)
  redis.call('set', tomb, mark or '1', 'px', ttl_ms)
end

local function hand_over(lock, successor, lease_ms, token, tomb, ttl_ms, handed)
  redis.call('del', lock)
  redis.call('hset', lock, successor, 1)
  redis.call('pexpire', lock, lease_ms)
  leave_tombstone(tomb, ttl_ms, handed .. string.format('%.0f', token))
  return {4, token}
end

local function resend_reply(tomb, lock, successor, released, handed)
  if not released then
    if redis.call('exists', tomb) == 1 then
      return {2, 0}
    end
    return {0, 0}
  end
  local done = redis.call('get', tomb)
  if not done then
    return {0, 0}
  end
  if successor and successor ~= '' and done ~= released
      and redis.call('hexists', lock, successor) == 1 then
    return {4, tonumber(string.sub(done, #handed + 1))}
  end
  return {2, 0}
end

local function void_attempt(key, ttl_ms)
  redis.call('set', key, '1', 'px', ttl_ms)
end

local function release_count(lock, field, count, tomb, successor, released, handed)
  local held = redis.pcall('hget', lock, field)
  if type(held) == 'table' and held.err then
    return {-1, redis.call('type', lock).ok}
  end
  if not held then
    return resend_reply(tomb, lock, successor, released, handed)
  end
  local left = tonumber(count) - 1
  if left > 0 then
    redis.call('hset', lock, field, left)
    return {1, left}
  end
  return nil
end
