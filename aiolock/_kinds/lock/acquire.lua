-- aiolock lock: acquire a reentrant lock, or re-enter one the owner already holds.
--
-- KEYS[1]  lock state: one string (see state.lua); held: owner, count, token, epoch, flag
-- KEYS[2]  void marker of this attempt: present if an undo got there first
-- KEYS[3]  the name's turns (see turns.lua): read, and written if it exists or ARGV[5] asks
-- ARGV[1]  owner field (unique per acquisition)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  hold count the client believes it has (0 for a new acquisition)
-- ARGV[4]  the attempting manager's id (the waiter flag, if the lock is busy)
-- ARGV[5]  present when the manager asks for a turn: its entry's lifetime in ms
-- ARGV[3..4] may be left out (the client does for a new acquisition under a field that
-- begins with its manager's id and a ':', as its fields do): then as '0' and the owner
-- field's part before its first ':' (the whole field if it has none). Each argument costs
-- the server a Lua string, more per call than most of the common path's Lua (issue 21).
--
-- Returns, on the common path, the new fencing token alone (an integer: acquired anew),
-- else {code, value} (the codes' names in codes.lua):
--   { 1, token}  ACQUIRED: acquired anew (a resent attempt); token is the new fencing token
--   { 2, count}  REENTERED: count is the new hold count
--   { 0, pttl }  BUSY: held by another owner; pttl is its remaining lease in ms (-1: none);
--                or free but another manager's turn: pttl is that turn's time left
--   { 3, 0    }  VOIDED: an undo reached Redis before this attempt did; nothing done
--   {-1, type }  BAD_KEY: KEYS[1] holds a value of another Redis type (or a string
--                aiolock did not write: 'string'); nothing done
--
-- A resent command (the client retries after a dropped connection) finds the hold
-- count already at ARGV[3] + 1 and answers as the first run did instead of counting
-- twice; a resent new acquisition gets a fresh token, larger than the first run's.
--
-- Every new token is the server's clock in microseconds (TIME), or the token before it
-- plus one if the clock is not above that (state.lua). Not the token before plus one
-- alone: a replica promoted with an older copy of the state (or a state restored from
-- an older file) would count on from a token below those clients already saw, and hand
-- them out again (issue 36).
--
-- The reply codes (codes.lua) come first. The common paths come next, before the state's
-- functions (state.lua; Lua 5.1 makes each of them anew on every call, and NOT_OURS a
-- table): a grant from no state or from a free one returns without them, inlining the
-- little it needs (marked `(state.lua: ...)`). Only while some manager has a turn (or
-- this one asks for one) do the turns' definitions come first: a free lock in another
-- manager's turn is busy for everyone else.
--@include _kinds/lock/codes

local got = redis.call('mget', KEYS[1], KEYS[2], KEYS[3])
if got[2] then
  return {VOIDED, 0}
end
local state = got[1]
-- The waiter flag a grant starts with: '' unless managers had turns. Then the release of
-- this hold must publish: for the managers whose turns are left, and for those told the
-- free lock was busy in a turn (they did not ask for one, and sleep until a release).
local flag = ''
if got[3] or ARGV[5] then
--@include _kinds/lock/turns
  local manager = ARGV[4] or string.sub(ARGV[1], 1, (string.find(ARGV[1], ':', 1, true) or 0) - 1)
  local now = turns_now()
  local live = turns_live(got[3], now)
  local free = not state or string.byte(state, 1) == 124
  if free and (not live[1] or live[1][1] == manager) then
    -- Granted below (unless the key is not ours): the turn is used up.
    turns_drop(live, manager)
    turns_store(KEYS[3], live, now)
    if got[3] then
      flag = '*'
    end
  elseif free or string.sub(state, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
    -- Busy: held by another owner, or free in another manager's turn.
    if ARGV[5] then
      turns_ask(live, manager, now + tonumber(ARGV[5]))
    end
    turns_store(KEYS[3], live, now)
    if free then
      return {BUSY, live[1][2] - now}
    end
  end
end
-- No state (a new epoch at the server's clock), or a free one (the next token of its
-- epoch: the clock, forced above the last token). MGET answers nil for a key of another
-- type: SET NX then refuses to write over it.
if not state then
  local now = redis.call('time')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local text = string.format('%d', token)  -- (state.lua: format_token, encode_held)
  if not redis.call('set', KEYS[1], ARGV[1] .. '|1|' .. text .. '|' .. text .. '|' .. flag,
      'nx', 'px', ARGV[2]) then
    return {BAD_KEY, redis.call('type', KEYS[1]).ok}
  end
  return token
end
if string.byte(state, 1) == 124 then  -- (state.lua: decode_state) free: '|<epoch>|<last>'
  local bar = string.find(state, '|', 2, true)
  local last = bar and tonumber(string.sub(state, bar + 1))
  if not last then
    return {BAD_KEY, 'string'}  -- NOT_OURS
  end
  local now = redis.call('time')  -- (state.lua: next_token)
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if token <= last then
    token = last + 1
  end
  -- (state.lua: encode_held, with the epoch's text as the free state has it)
  redis.call('set', KEYS[1],
    ARGV[1] .. '|1|' .. string.format('%d', token) .. string.sub(state, 1, bar) .. flag,
    'px', ARGV[2])
  return token
end
--@include _kinds/lock/state

-- Held: by another owner (busy), or by this one (a re-entry, or a resent attempt).
local field, count, token, epoch, flag = decode_state(state)
if not field then
  return NOT_OURS
end
if field ~= ARGV[1] then
  -- Held by another owner: say that someone waits (unless said already), so that the
  -- final release publishes.
  local ttl = redis.call('pttl', KEYS[1])
  local manager = ARGV[4]
  if not manager then  -- left out: the owner field's part before its first ':'
    manager = string.sub(ARGV[1], 1, (string.find(ARGV[1], ':', 1, true) or 0) - 1)
  end
  if flag ~= manager and flag ~= '*' then
    local marked = encode_held(field, count, token, epoch, flag == '' and manager or '*')
    redis.call('set', KEYS[1], marked, 'keepttl')
  end
  return {BUSY, ttl}
end
if count ~= tonumber(ARGV[3] or 0) + 1 then
  count = count + 1
elseif count == 1 then
  -- a resent new acquisition: a fresh token, larger than the first's
  token = next_token(token)
end
redis.call('set', KEYS[1], encode_held(field, count, token, epoch, flag), 'px', ARGV[2])
if count == 1 then
  return {ACQUIRED, token}
end
return {REENTERED, count}
