-- Frozen copy of aiolock/_kinds/lock/release.lua before issue 21 (includes spliced), for benchmarks.script_floor.
-- aiolock lock: release one hold; on the last one, free the lock or hand it over.
--
-- KEYS[1]  lock hash: {owner field -> hold count}
-- KEYS[2]  fence key (see fence.lua)
-- KEYS[3]  tombstone of this final release: lets a resent release answer as the first
-- ARGV[1]  owner field
-- ARGV[2]  hold count the client has before this release (>= 1); 1 = the last hold
-- ARGV[3]  message to publish (the releasing manager's id)
-- ARGV[4]  the releasing hold's fencing token
-- ARGV[5]  fence state lifetime in ms ('0' none, '-1' forever)
-- ARGV[6]  tombstone lifetime in ms
-- ARGV[7]  owner field of a local successor to hand the lock to, or '' for none
-- ARGV[8]  the successor's lease in milliseconds
-- ARGV[9]  '1': hand over even if other clients listen on the channel
-- ARGV[10] '1' if the releasing manager itself listens on the channel, else '0'
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns, on the common path, an integer n alone: released, the key deleted and the
-- release published, n other clients heard it (the releasing manager then yields to
-- them); else {code, value}:
--   { 1, count}  one hold released, still held; count holds are left
--   { 2, 0    }  a resend of a final release that had freed the lock
--   { 4, token}  handed over: the successor now holds the lock with this fencing token
--   { 0, 0    }  this owner does not hold the lock
--   {-1, type }  KEYS[1] holds a value of another Redis type; nothing done
--
-- Idempotent, so a resent command is harmless: a nested release sets the count to the
-- client's count minus one (never decrements twice), and a final release leaves a
-- tombstone for ARGV[6] ms, so a resend finds it and answers as the first run did,
-- however many owners came and went in between. Who may receive a hand-over (fairness
-- between clients) is the engine's decision, passed in ARGV[10]; the script only
-- counts the other listeners when it must.
-- aiolock prelude: the fencing rule, shared by every kind's scripts (spliced in by the
-- loader where a script says `--@include _kinds/_lua/fence`).
--
-- fence(key) -> a new fencing token for the resource whose fence key is `key`: the
-- server's clock in microseconds, forced above the last token released there (kept in
-- `key` only when the manager asks for fence state: fence_ttl). TIME is read afresh by
-- every call, and two scripts never run in the same microsecond, so tokens increase
-- strictly as long as the server's clock does not go back, and regardless of the clock
-- while the fence key lives.
-- keep_fence(key, token, ttl_ms) records `token` as the last one: ttl_ms '0' keeps
-- nothing, '-1' keeps it forever, else for ttl_ms milliseconds.
-- keep_largest_fence(key, token, ttl_ms) does the same unless a larger token is kept
-- already: for kinds whose holds end out of order (readers, permits), where the token
-- released last need not be the largest.

local function fence(key)
  local now = redis.call('time')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = redis.pcall('get', key)
  if type(last) == 'table' and last.err then
    error({err = 'WRONGTYPE key ' .. key .. ' holds a ' .. redis.call('type', key).ok
      .. ', not a fencing token'})
  end
  last = tonumber(last or 0)
  if token <= last then
    token = last + 1
  end
  return token
end

local function keep_fence(key, token, ttl_ms)
  if ttl_ms == '-1' then
    redis.call('set', key, token)
  elseif ttl_ms ~= '0' then
    redis.call('set', key, token, 'px', ttl_ms)
  end
end

local function keep_largest_fence(key, token, ttl_ms)
  if tonumber(token) > tonumber(redis.call('get', key) or 0) then
    keep_fence(key, token, ttl_ms)
  end
end

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
-- The void marker of an acquire attempt whose outcome is unknown: set by the undo that
-- finds the attempt has not run (or not yet), for a lifetime the client passes (longer
-- than any delayed attempt). The acquire script checks it first and does nothing.
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


local held = redis.pcall('hget', KEYS[1], ARGV[1])
if type(held) == 'table' and held.err then
  return {-1, redis.call('type', KEYS[1]).ok}
end
if not held then
  return resend_reply(KEYS[3], KEYS[1], ARGV[7], '0', '')
end

local left = tonumber(ARGV[2]) - 1
if left > 0 then
  redis.call('hset', KEYS[1], ARGV[1], left)
  return {1, left}
end

local channel = KEYS[1] .. ':released'
local mine = tonumber(ARGV[10])
if ARGV[7] ~= '' and (ARGV[9] == '1'
    or redis.call('pubsub', 'numsub', channel)[2] - mine <= 0) then
  return hand_over(KEYS[1], ARGV[7], ARGV[8], fence(KEYS[2]), KEYS[3], ARGV[6], '')
end
redis.call('del', KEYS[1])
keep_fence(KEYS[2], ARGV[4], ARGV[5])
leave_tombstone(KEYS[3], ARGV[6], '0')
return redis.call('publish', channel, ARGV[3]) - mine
