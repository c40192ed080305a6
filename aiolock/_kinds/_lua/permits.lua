-- aiolock prelude of the semaphore scripts: permit and claim bookkeeping (spliced in by
-- the loader where a script says `--@include _kinds/_lua/permits`).
--
-- Holders: a hash H {permit field -> permits, '#held' -> total permits held} and a
-- sorted set E {permit field -> expiry, ms on the server's clock}. Both exist only
-- while something is held and expire with the last permit's lease, so a semaphore
-- whose holders all crashed leaves nothing behind.
-- Claims of waiting requests: a sorted set C {claim field -> arrival, us on the server's
-- clock} and a hash W {claim field -> '<permits>:<expiry ms>'}.
-- The limit L (a string) lives at least as long as H and C: whoever pushes back the
-- expiry of H or C pushes back L's too (keep_limit), so the stored limit holds while
-- anything is held or claimed and goes with the last lease or claim.

local TOTAL = '#held'

local function now_us()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Remove one holder; returns the permits it had (0 if it was not there).
local function drop_holder(H, E, field)
  local n = redis.call('hget', H, field)
  redis.call('zrem', E, field)
  if not n then
    return 0
  end
  n = tonumber(n)
  redis.call('hdel', H, field)
  if redis.call('hincrby', H, TOTAL, -n) <= 0 then
    redis.call('del', H, E)
  end
  return n
end

-- Remove every holder whose lease ended by `now` (ms); returns the permits freed.
local function prune(H, E, now)
  local freed = 0
  for _, field in ipairs(redis.call('zrangebyscore', E, '-inf', now)) do
    freed = freed + drop_holder(H, E, field)
  end
  return freed
end

-- Let the limit key L live at least `ttl` ms more; never shortens it, and gives a limit
-- stored without expiry (by set_limit while idle, or by an older version) one. One
-- command when L has a TTL shorter than `ttl` (the usual case: a renewal pushes it
-- back): PEXPIRE GT treats a key without TTL as never expiring, so only then (0 and a
-- PTTL of -1) does it take a second command; a missing L (PTTL -2) is left missing.
local function keep_limit(L, ttl)
  if ttl > 0 and redis.call('pexpire', L, ttl, 'GT') == 0 and redis.call('pttl', L) == -1 then
    redis.call('pexpire', L, ttl)
  end
end

-- Let the limit key L live exactly as long as the holders H or the claims C (may
-- shorten it: used where a claim became a hold, so that the claim's longer lifetime
-- does not keep the limit once the last claim is gone).
local function fit_limit(L, H, C)
  local ttl = math.max(redis.call('pttl', H), redis.call('pttl', C))
  if ttl > 0 then
    redis.call('pexpire', L, ttl)
  end
end

-- Let both holder keys (and the limit key L, if given) live as long as the longest
-- lease in E.
local function expire_holders(H, E, now, L)
  local last = redis.call('zrange', E, -1, -1, 'withscores')
  if last[2] then
    local ttl = math.max(1, math.ceil(tonumber(last[2]) - now))
    redis.call('pexpire', H, ttl)
    redis.call('pexpire', E, ttl)
    if L then
      keep_limit(L, ttl)
    end
  end
end

-- The live claims in arrival order, as {field, permits, expiry ms}; expired ones are
-- removed on the way.
local function live_claims(C, W, now)
  local live = {}
  local fields = redis.call('zrange', C, 0, -1)
  if #fields == 0 then
    return live
  end
  local data = redis.call('hmget', W, unpack(fields))
  for i, field in ipairs(fields) do
    local n, expiry
    if data[i] then
      n, expiry = string.match(data[i], '^(%d+):(%d+)$')
    end
    if n and tonumber(expiry) > now then
      live[#live + 1] = {field, tonumber(n), tonumber(expiry)}
    else
      redis.call('zrem', C, field)
      redis.call('hdel', W, field)
    end
  end
  return live
end

-- Withdraw one claim; returns 1 if it was there.
local function drop_claim(C, W, field)
  if redis.call('zrem', C, field) == 1 then
    redis.call('hdel', W, field)
    return 1
  end
  return 0
end
