-- STUDY, not shipped (benchmarks/scripts/slots.py; issue 40, target 1): the release of a
-- permit of the slot layout (described in slots_acquire.lua beside this file). For a
-- permit of one slot it runs what the lock's release.lua runs on its common path.
--
-- KEYS[1..]   the permit's slots (B:s:<i>, as its grant answered)
-- ARGV[1]     '<field>|<permits>|<token>|': how each of its slots' held state begins
-- ARGV[2]     the permit's token
-- ARGV[3]     how long a free slot state is kept, ms ('-1' forever): the lock's keep
--             (max(fence_ttl, 10 s)); the free state is the slot's tombstone, as the
--             lock's is (state.lua), so a release leaves no key of its own
-- ARGV[4]     message to publish if a slot's flag says claims were registered (the
--             manager's id)
-- The release channel is B .. ':released' (B: the slot key without ':s:<i>').
--
-- Returns, on the common path, an integer n: released; n clients heard it (0: no flag,
-- nothing published); else {2, 0}: a resend of a release that had run (the token is in
-- the first slot's released range, as the lock's release.lua decides), or {0, 0}: not
-- held (its lease ended, or force-released).

local head = ARGV[1]
local freed, flagged = 0, false
for i = 1, #KEYS do
  local state = redis.call('get', KEYS[i])
  if state and string.find(state, head, 1, true) == 1 then
    if string.byte(state, -1) ~= 124 then  -- a flag: '<...>|*'
      flagged = true
      state = string.sub(state, 1, -2)
    end
    -- (state.lua: encode_free) '|<epoch>|<token>', the epoch's text as the state has it
    local free = string.sub(state, #head) .. ARGV[2]
    if ARGV[3] == '-1' then
      redis.call('set', KEYS[i], free)
    else
      redis.call('set', KEYS[i], free, 'px', ARGV[3])
    end
    freed = freed + 1
  end
end
if freed == 0 then
  local state = redis.call('get', KEYS[1])
  if state then
    local released = tonumber(ARGV[2])
    local epoch, last = string.match(state, '^|(%d+)|(%d+)$')
    if epoch then
      if released >= tonumber(epoch) and released <= tonumber(last) then
        return {2, 0}
      end
    else
      local token, since = string.match(state, '^[^|]+|%d+|(%d+)|(%d+)|')
      if token and released >= tonumber(since) and released < tonumber(token) then
        return {2, 0}
      end
    end
  end
  return {0, 0}
end
if flagged then
  return redis.call('publish', string.match(KEYS[1], '^(.*):s:%d+$') .. ':released', ARGV[4])
end
return 0
