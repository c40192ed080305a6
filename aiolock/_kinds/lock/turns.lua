-- aiolock lock prelude: the turns of starving managers (spliced in where a lock script
-- says `--@include _kinds/lock/turns`).
--
-- A manager whose tasks found a name busy STARVE_AFTER times (aiolock/_engine/turns.py)
-- asks for a turn: its id joins the name's turns, a string key beside the state,
--   '<lock key>:turns'  '<manager id> <expiry ms> <manager id> <expiry ms> ...'
-- in the order the managers asked, each with the server time (ms) its entry lapses at
-- unless refreshed (the manager refreshes its entries while it waits, as claims are:
-- aiolock/_engine/claims.py). While a live entry exists, the lock is granted to the first
-- live entry's manager only, and a release never hands the lock to a task of its own
-- manager past it: so a manager that asked waits for at most the managers ahead of it,
-- each one grant, whatever the race to Redis after a release (subscription order,
-- distance) would have given. A grant to a manager removes its entry.
-- Manager ids are hex (aiolock._keys.new_manager_id): never a space.
--
-- turns_now()                        the server's clock in ms
-- turns_live(text, now)              the live entries of a turns value (nil: none), as a
--                                    list of {manager, expiry}
-- turns_ask(live, manager, expiry)   add manager at the tail, or move its expiry
-- turns_drop(live, manager)          remove manager's entry; whether it had one
-- turns_store(key, live, now)        write the entries back (delete the key if none); the
--                                    key lapses with its last entry

local function turns_now()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function turns_live(text, now)
  local live = {}
  if text then
    for manager, expiry in string.gmatch(text, '(%S+) (%d+)') do
      expiry = tonumber(expiry)
      if expiry > now then
        live[#live + 1] = {manager, expiry}
      end
    end
  end
  return live
end

local function turns_ask(live, manager, expiry)
  for i = 1, #live do
    if live[i][1] == manager then
      live[i][2] = expiry
      return
    end
  end
  live[#live + 1] = {manager, expiry}
end

local function turns_drop(live, manager)
  for i = 1, #live do
    if live[i][1] == manager then
      table.remove(live, i)
      return true
    end
  end
  return false
end

local function turns_store(key, live, now)
  if #live == 0 then
    redis.call('del', key)
    return
  end
  local parts, last = {}, now + 1
  for i = 1, #live do
    parts[i] = live[i][1] .. ' ' .. string.format('%d', live[i][2])
    if live[i][2] > last then
      last = live[i][2]
    end
  end
  redis.call('set', key, table.concat(parts, ' '), 'px', last - now)
end
