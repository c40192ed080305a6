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
