-- aiolock lock: renew or check many holds in one round trip (also used by extend).
--
-- KEYS[i]      lock state i (see state.lua)
-- ARGV[2i-1]   owner field that should hold KEYS[i]
-- ARGV[2i]     new lease in milliseconds, or '0' to check the hold without extending it
--              (fixed-lease holds: the watchdog only makes sure Redis still has them)
--
-- Returns an array with one entry per key: 1 if that owner still holds the lock (and
-- its lease was renewed if asked), 0 if not (expired, force-released, evicted, or the
-- key was replaced by another type). On Redis Cluster a batch must not span slots: the
-- watchdog then groups holds by slot (a single server takes any mix).

local held = {}
for i = 1, #KEYS do
  local state = redis.pcall('get', KEYS[i])
  local head = ARGV[2 * i - 1] .. '|'  -- (state.lua: a held state begins '<field>|')
  if type(state) == 'string' and string.sub(state, 1, #head) == head then
    if ARGV[2 * i] ~= '0' then
      redis.call('pexpire', KEYS[i], ARGV[2 * i])
    end
    held[i] = 1
  else
    held[i] = 0
  end
end
return held
