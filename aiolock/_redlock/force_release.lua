-- aiolock redlock: delete one master's key of a Redlock whoever holds it, and announce it
-- (an administrator's tool).
--
-- KEYS[1]  lock key on this master
-- The release channel is KEYS[1] .. ':released'; the message is the deleted token, so
-- that waiting managers count it as that hold's release (every master sends one) and the
-- holder's own manager ignores it (it learns of the loss at its next renewal round).
--
-- Returns {1, token} if this master had a key (now deleted and announced), {0} if not,
-- {-1, type} if KEYS[1] holds a value of another Redis type (left alone).

local kind = redis.call('type', KEYS[1]).ok
if kind == 'none' then
  return {0}
end
if kind ~= 'string' then
  return {-1, kind}
end
local token = redis.call('get', KEYS[1])
redis.call('del', KEYS[1])
redis.call('publish', KEYS[1] .. ':released', token)
return {1, token}
