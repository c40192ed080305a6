-- aiolock lock prelude: the lock's whole per-name state in ONE string key (issue 21), read
-- and written here for every lock script. Spliced in where a lock script says
-- `--@include _kinds/lock/state` (aiolock/_redis/scripts.py), after codes.lua (the reply
-- codes and KEEP_MS it uses). Its Python twin is aiolock/_kinds/lock/state.py (the client's
-- reads, `aiolock show`); tests/unit/_kinds/lock/test_state.py round-trips random states
-- between the two.
--
--   held  '<field>|<count>|<token>|<epoch>|<flag>'  PX = the holder's lease
--   free  '|<epoch>|<last>'                         PX = keep ms (or no expiry)
--
-- field: the holder's owner field (never contains '|', never empty); count: its hold
-- count; token: its fencing token; flag: '' (no waiter seen), a manager id (only that
-- manager's tasks were found waiting), or '*' (waiters of several managers). A busy
-- attempt sets the flag; a final release publishes only if it is set, and the flag goes
-- with the hold (a grant from a free state starts without one).
--
-- Tokens: every new token (a grant, a hand-over, a resent new acquisition) is the
-- server's clock in microseconds (TIME), or the token before it plus one where the
-- clock is not above that (next_token); with no state, the clock starts a new epoch.
-- Not the token before plus one alone: a replica promoted with an older copy of the
-- state would count on from below the tokens clients had already seen (issue 36). So
-- tokens rise across such a copy as long as the clock of the node that grants is not
-- behind the clock that made the newest token by more than the time between the two.
--
-- The inverted tombstone: every hold whose token lies in [epoch, token) (held) or in
-- [epoch, last] (free) ended by a release. A lease that runs out deletes the whole
-- state, and a force release writes a free state whose epoch is above every token given
-- so far: both start a new epoch. So a resent release (its reply lost) answers
-- "released" if its token is in that range, and "not held" otherwise, with no key per
-- release. Tokens skip numbers (they follow the clock), so the range also holds numbers
-- no hold of this state had: only a hold granted where this state's history does not
-- reach names one (a grant an older copy lacks, above), and its release then answers
-- "released" where "not held" would be true (the watchdog's check reports such a hold
-- lost when it comes before the release).
--
-- decode_state(raw) -> field, count, token, epoch, flag  (field '' for a free state,
--     whose `token` is then its last token; count 0). Numbers are Lua numbers (exact up
--     to 2^53). nil for a value aiolock did not write (someone else's string): the
--     scripts then answer NOT_OURS, the reply of a key of another type.
-- encode_held(field, count, token, epoch, flag) -> a held state
-- encode_free(epoch, last) -> a free state
-- keep(key, value, keep_ms): store a free state for keep_ms ('-1': without expiry).
-- format_token(n): the decimal text of a token (exact up to 2^53).
-- next_token(last): the token after `last`: the server's clock in microseconds, or
--     last + 1 if the clock is not above last.
-- read_state(key): KEYS[1] as a string, or nil and the {BAD_KEY, type} reply of a key of
--     another type.
--
-- Lua 5.1 makes these functions (and the NOT_OURS table) anew on every call of a script
-- that reaches them. So the scripts whose every call counts do without them where they
-- can: acquire and release put their common paths before the include, and renew,
-- extend_by and lease_left include nothing; each inlines the little it needs, marked
-- `(state.lua: ...)`, and tests/unit/_kinds/lock/test_state.py checks that what they
-- write decodes as these functions would. Measured on redis-server 7.0 (issue 39): this
-- prelude before the common paths made an uncontended acquire and release 0.56 us of
-- server time slower (7%), and a renewal of 350 holds through a function per hold 7%.

local NOT_OURS = {BAD_KEY, 'string'}

local function decode_state(raw)
  if string.byte(raw, 1) == 124 then  -- '|': free
    local epoch, last = string.match(raw, '^|(%d+)|(%d+)$')
    if not epoch then
      return nil
    end
    return '', 0, tonumber(last), tonumber(epoch), ''
  end
  local field, count, token, epoch, flag = string.match(raw, '^([^|]+)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not field then
    return nil
  end
  return field, tonumber(count), tonumber(token), tonumber(epoch), flag
end

local function format_token(n)
  return string.format('%d', n)
end

local function encode_held(field, count, token, epoch, flag)
  return field .. '|' .. count .. '|' .. format_token(token) .. '|' .. format_token(epoch)
    .. '|' .. flag
end

local function encode_free(epoch, last)
  return '|' .. format_token(epoch) .. '|' .. format_token(last)
end

local function next_token(last)
  local now = redis.call('time')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if token <= last then
    return last + 1
  end
  return token
end

local function keep(key, value, keep_ms)
  if keep_ms == '-1' then
    redis.call('set', key, value)
  else
    redis.call('set', key, value, 'px', keep_ms)
  end
end

local function read_state(key)
  local state = redis.pcall('get', key)
  if type(state) == 'table' and state.err then
    return nil, {BAD_KEY, redis.call('type', key).ok}
  end
  return state, nil
end
