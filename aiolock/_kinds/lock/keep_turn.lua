-- aiolock lock: keep or give up a manager's turn (see turns.lua).
--
-- KEYS[1]  the name's turns
-- ARGV[1]  the entry's new lifetime in ms, or '0' to give the turn up
-- ARGV[2]  the manager's id
--
-- Returns 1 if the manager had a live entry (now kept, or removed), else 0. An entry that
-- lapsed is not made again: the manager asks anew with its next busy attempt, at the tail.
--@include _kinds/lock/turns

local now = turns_now()
local live = turns_live(redis.call('get', KEYS[1]), now)
local had
if ARGV[1] == '0' then
  had = turns_drop(live, ARGV[2])
else
  had = false
  for i = 1, #live do
    if live[i][1] == ARGV[2] then
      live[i][2] = now + tonumber(ARGV[1])
      had = true
    end
  end
end
if had then
  turns_store(KEYS[1], live, now)
end
return had and 1 or 0
