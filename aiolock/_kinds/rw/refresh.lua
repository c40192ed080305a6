-- aiolock rw: keep the claims of live waiting writers from expiring (one call per name
-- and manager, every claim_ttl / 3).
--
-- KEYS[1]  claims zset: {waiting writer's field -> claim end, server ms}
-- ARGV[1]  how long a claim lasts from now, in milliseconds
-- ARGV[2..] the fields of the claims to refresh
--
-- Only claims that still exist are refreshed (ZADD XX): a claim withdrawn meanwhile (the
-- writer got the lock or gave up) or deleted by a force release is never brought back by
-- a refresh that was already on its way. Returns how many claims were refreshed.
--@include _kinds/rw/common

local claims = KEYS[1]
local t = redis.call('type', claims).ok
if t ~= 'none' and t ~= 'zset' then
  return {-1, t, claims}
end
local now = now_ms()
purge_claims(claims, now)
local until_ms = now + tonumber(ARGV[1])
local refreshed = 0
for i = 2, #ARGV do
  refreshed = refreshed + redis.call('zadd', claims, 'xx', 'ch', until_ms, ARGV[i])
end
local last = redis.call('zrange', claims, -1, -1, 'withscores')
if #last > 0 then
  redis.call('pexpire', claims, tonumber(last[2]) - now)
end
return refreshed
