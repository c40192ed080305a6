-- aiolock lock: release one hold; on the last one, free the lock or hand it over.
--
-- KEYS[1]  lock state (see state.lua)
-- KEYS[2]  the name's turns (see turns.lua); sent with a successor only: the lock is not
--          handed over while another manager has a turn
-- ARGV[1]  '<owner field>|1|<token>|': how the state begins while this hold is held once
--          (sent whatever the hold count; the owner field is what precedes the first '|')
-- ARGV[2]  the releasing hold's fencing token
-- ARGV[3]  how long a free state is kept, in ms ('-1' forever): max(fence_ttl, 10 s);
--          left out: KEEP_MS (codes.lua), the default fence_ttl's
-- ARGV[4]  hold count the client has before this release (>= 1); 1 = the last hold
-- ARGV[5]  message to publish (the releasing manager's id)
-- ARGV[6]  owner field of a local successor to hand the lock to, or '' for none
-- ARGV[7]  the successor's lease in milliseconds
-- ARGV[8]  '1': hand over even if other managers' tasks wait
-- ARGV[9]  '1' if the releasing manager itself listens on the channel, else '0'
-- ARGV[3..9] may be left out from the end (the client sends ARGV 1-2, or 1-3 with a keep
-- other than the default, for a final release under a field that begins with its
-- manager's id and a ':', as its fields do, with no successor and its manager not
-- listening): then as above, '1', the owner field's part before its first ':' (the whole
-- field if it has none), '', '0', '0', '0'. Each argument costs the server a Lua string,
-- more per call than most of the common path's Lua (issue 21).
-- The release channel is KEYS[1] .. ':released'.
--
-- Returns, on the common path, an integer n alone: released (the state is free), n
-- other clients heard the release message (published only if the waiter flag was set;
-- the releasing manager then yields to them); else {code, value} (names in codes.lua):
--   { 1, count}  STILL_HELD: one hold released, still held; count holds are left
--   { 2, 0    }  RELEASED: a resend of a final release that had freed the lock
--   { 4, token}  HANDED_OVER: the successor now holds the lock with this fencing token
--                (a new one: the server's clock, forced above the releasing hold's)
--   { 0, 0    }  NOT_HELD: this owner does not hold the lock
--   {-1, type }  BAD_KEY: KEYS[1] holds a value of another Redis type (or a string
--                aiolock did not write: 'string'); nothing done
--
-- Idempotent, so a resent command is harmless: a nested release sets the count to the
-- client's count minus one (never decrements twice), and a final release leaves its
-- token inside the epoch's released range (state.lua), so a resend answers as the first
-- run did for as long as the state lives and no lease ran out or force release came
-- since (then: { 0, 0 }).
--
-- The reply codes and KEEP_MS (codes.lua) come first. The common path comes next, before
-- the state's functions (state.lua; Lua 5.1 makes each of them anew on every call, and
-- NOT_OURS a table): it returns without them, inlining the little it needs (marked
-- `(state.lua: ...)`).
--@include _kinds/lock/codes

local state = redis.pcall('get', KEYS[1])
-- The common path: the last hold of its owner, no waiter flag, no successor. ARGV[1] is
-- the held state's beginning, made by the client: a concatenation less here.
if (ARGV[4] or '1') == '1' and type(state) == 'string' and (ARGV[6] or '') == '' then
  local head = ARGV[1]
  if string.find(state, head, 1, true) == 1 and string.byte(state, -1) == 124 then
    -- (state.lua: encode_free) '|<epoch>|<token>', the epoch's text as the state has it
    local free = string.sub(state, #head) .. ARGV[2]
    local keep_ms = ARGV[3] or KEEP_MS
    if keep_ms == '-1' then  -- (state.lua: keep)
      redis.call('set', KEYS[1], free)
    else
      redis.call('set', KEYS[1], free, 'px', keep_ms)
    end
    return 0
  end
end
--@include _kinds/lock/state
--@include _kinds/lock/turns

if type(state) == 'table' then  -- GET's error: a key of another type (read_state)
  return {BAD_KEY, redis.call('type', KEYS[1]).ok}
end
if not state then
  return {NOT_HELD, 0}
end
local successor = ARGV[6] or ''
local mine = string.sub(ARGV[1], 1, string.find(ARGV[1], '|', 1, true) - 1)  -- owner field
local field, count, token, epoch, flag = decode_state(state)
if not field then
  return NOT_OURS
end
if field ~= mine then
  if successor ~= '' and field == successor then
    return {HANDED_OVER, token}  -- a resend of a release that handed the lock over
  end
  local released = tonumber(ARGV[2])
  if released >= epoch and (released < token or (field == '' and released == token)) then
    return {RELEASED, 0}
  end
  return {NOT_HELD, 0}
end

local left = tonumber(ARGV[4] or 1) - 1
if left > 0 then
  redis.call('set', KEYS[1], encode_held(field, left, token, epoch, flag), 'keepttl')
  return {STILL_HELD, left}
end

local message = ARGV[5]
if not message then  -- left out: the owner field's part before its first ':'
  message = string.sub(mine, 1, (string.find(mine, ':', 1, true) or 0) - 1)
end
-- With a successor: the turns decide first. The first live turn another manager's: the
-- lock is freed for it, not handed over, and the release publishes (its busy attempt set
-- the flag; a flag lost with an earlier lease is set here). This manager's own: a
-- hand-over uses it up.
local waits, live, now = false, nil, nil
if successor ~= '' and KEYS[2] then
  now = turns_now()
  live = turns_live(redis.call('get', KEYS[2]), now)
  if live[1] and live[1][1] ~= message then
    waits = true
    if flag == '' then
      flag = '*'
    end
  end
end
if successor ~= '' and not waits and (ARGV[8] == '1' or flag == '' or flag == message) then
  if live and turns_drop(live, message) then
    turns_store(KEYS[2], live, now)
  end
  token = next_token(token)  -- a new hold: the clock, forced above this one (state.lua)
  redis.call('set', KEYS[1], encode_held(successor, 1, token, epoch, flag), 'px', ARGV[7])
  return {HANDED_OVER, token}
end
keep(KEYS[1], encode_free(epoch, token), ARGV[3] or KEEP_MS)
if flag == '' then
  return 0
end
return redis.call('publish', KEYS[1] .. ':released', message) - (ARGV[9] == '1' and 1 or 0)
