-- STUDY, not shipped (benchmarks/scripts/slots.py; issue 40, target 1): the acquire of a
-- semaphore whose permits are slot keys. Run only by the study, on its own server.
--
-- Layout (base B = '<prefix>:sem:{<name>}', one hash tag: one Cluster slot):
--   B:s:<i>   slot i (1 <= i <= top): the lock's state (aiolock/_kinds/lock/state.lua).
--             held  '<field>|<permits of the request>|<token>|<epoch>|<flag>'  PX = lease
--             free  '|<epoch>|<last token>'                                    PX = keep
--             flag: '' or '*' (claims were registered while it was held: its release
--             publishes; the claim path, not in this study, sets it on the live slots)
--             A permit of n units holds n slots under one field and one token. Its
--             renewal is the lock's renew.lua over its slot keys (same script, same
--             batches as locks); a slot whose lease ended is gone (or re-granted under
--             another field), so that renewal reports it lost and never revives it.
--   B:meta    '<limit>|<top>|<claims>|<until ms>': the stored limit; top >= limit, the
--             highest slot that may be live (above the limit only after a lowered
--             limit); claims '1' while claims may be registered (C and W of the shipped
--             layout; the FIFO claim path is not part of this study); until: when its
--             TTL ends (server clock, ms), so that a grant rewrites it only when its
--             lease would outlast it. Not pushed by renewals (see the study's report).
--   B:fence   the last token issued, as shipped (fence.lua); written only when ARGV[6]
--             asks: without it a slot's free state is its fence, as a lock's state is
--             (tokens rise per slot across a clock that went back, not across slots)
--   B:void:<attempt>  this attempt's mark: '1' an undo voided it (as shipped), or
--             '=<token>|<i>,<j>,...' it was granted those slots. Written only when the
--             grant is not the hinted slot alone (or ARGV[8] asks): a resend reads the
--             hinted slot and the mark in the first MGET, so finds its grant either way,
--             and an undo finds the slots to free the same way
--
-- KEYS[1]  B:meta
-- KEYS[2]  B:fence
-- KEYS[3]  B:void:<attempt id>
-- ARGV[1]  field of the request (unique per request)
-- ARGV[2]  permits asked for (>= 1)
-- ARGV[3]  lease ms
-- ARGV[4]  the limit the handle was made with
-- ARGV[5]  slot to try first: the client's hint (the first slot its last grant had),
--          '1' for none. Costs the server nothing: it is read in the first MGET.
-- ARGV[6]  fence key lifetime ms ('-1' forever), or '0': no fence key (see B:fence)
-- ARGV[7]  lifetime of the grant's mark (the void marker's: twice the lease at least)
-- ARGV[8]  '1': write the grant's mark whatever slots the grant has (optional)
-- Slot keys are built here from KEYS[1] (B .. ':s:' .. i): not declared in KEYS (same
-- hash tag, so one Cluster slot; a proxy or server that enforces declared keys refuses).
--
-- Returns {token, i, ...}: granted, slots i...; {1, token, i, ...}: a resend of a granted
-- attempt; {0, -1}: busy (the study registers no claim); {3, 0}: voided; {-2, limit}:
-- the handle has another limit; {-3, limit}: more permits than the limit; {-4, 0}: claims
-- may be registered, so the shipped FIFO claim policy decides (not in the study).

local base = string.sub(KEYS[1], 1, -6)  -- KEYS[1] without ':meta'
local field, want = ARGV[1], tonumber(ARGV[2])
local start = tonumber(ARGV[5])
local got = redis.call('mget', KEYS[3], KEYS[1], KEYS[2], base .. ':s:' .. start)

if got[1] then
  if got[1] == '1' then
    return {3, 0}
  end
  -- A resend of an attempt that was granted: its slots, if still this request's.
  local token, list = string.match(got[1], '^=(%d+)|(.*)$')
  local reply = {1, tonumber(token)}
  local mine = field .. '|'
  for i in string.gmatch(list, '%d+') do
    local state = redis.call('get', base .. ':s:' .. i)
    if type(state) ~= 'string' or string.sub(state, 1, #mine) ~= mine then
      return {0, -1}  -- lost since (a lease that ended): the client asks again
    end
    reply[#reply + 1] = tonumber(i)
  end
  return reply
end

-- A resend whose grant is the hinted slot: that slot holds this request's field.
local head = field .. '|'
local hinted = got[4]
if hinted and string.sub(hinted, 1, #head) == head then
  local token = string.match(hinted, '^[^|]+|%d+|(%d+)|')
  return {1, tonumber(token), start}
end

-- The common path: the meta key says the handle's limit, no lowered limit, no claims,
-- and lives past this lease; the hinted slot is free; one permit asked for.
local common = ARGV[4] .. '|' .. ARGV[4] .. '||'
local meta = got[2]
if want == 1 and meta and string.sub(meta, 1, #common) == common and start <= tonumber(ARGV[4])
    and (not hinted or string.byte(hinted, 1) == 124) then
  local now = redis.call('time')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local floor = tonumber(got[3] or 0)
  local epoch
  if hinted then  -- (state.lua: decode_state, next_token) a free state '|<epoch>|<last>'
    local bar = string.find(hinted, '|', 2, true)
    epoch = string.sub(hinted, 2, bar - 1)
    local last = tonumber(string.sub(hinted, bar + 1))
    if last > floor then
      floor = last
    end
  end
  if token <= floor then
    token = floor + 1
  end
  local text = string.format('%d', token)
  local ends = math.floor(token / 1000) + tonumber(ARGV[3])
  if tonumber(string.sub(meta, #common + 1)) >= ends then
    redis.call('set', base .. ':s:' .. start, head .. '1|' .. text .. '|' .. (epoch or text)
      .. '|', 'px', ARGV[3])
    if ARGV[6] == '-1' then
      redis.call('set', KEYS[2], text)
    elseif ARGV[6] ~= '0' then
      redis.call('set', KEYS[2], text, 'px', ARGV[6])
    end
    if ARGV[8] == '1' then
      redis.call('set', KEYS[3], '=' .. text .. '|' .. start, 'px', ARGV[7])
    end
    return {token, start}
  end
end

local limit, top, claims, until_ms = tonumber(ARGV[4]), nil, false, 0
if got[2] then
  local l, t, c, u = string.match(got[2], '^(%d+)|(%d+)|(%d?)|(%d+)$')
  limit, top, claims, until_ms = tonumber(l), tonumber(t), c == '1', tonumber(u)
  if limit ~= tonumber(ARGV[4]) then
    return {-2, limit}
  end
end
top = top or limit
if claims then
  return {-4, 0}
end
if want > limit then
  return {-3, limit}
end

-- Find `want` free slots among 1..limit, from the hint on (wrapping). A slot is free
-- when it has no state or a free one ('|' first). With a lowered limit (top > limit),
-- every slot up to top is read and the live ones counted: the grant must fit under the
-- limit however many slots above it are still held.
local slots, states = {}, {}
local live, highest = 0, 0
local function look(i, state)
  if not state or string.byte(state, 1) == 124 then
    if i <= limit and #slots < want then
      slots[#slots + 1] = i
      states[#states + 1] = state
    end
  else
    live = live + 1
    highest = math.max(highest, i)
  end
end
local looked = 0
if start < 1 or start > limit then
  start = 1
else
  look(start, got[4])
  looked = 1
end
if #slots < want or top > limit then
  -- the rest, in chunks of 32: start+1..top, then 1..start-1
  local order = {}
  for i = start + looked, top do
    order[#order + 1] = i
  end
  for i = 1, start - 1 do
    order[#order + 1] = i
  end
  local at = 1
  while at <= #order and (#slots < want or top > limit) do
    local names = {}
    for j = at, math.min(at + 31, #order) do
      names[#names + 1] = base .. ':s:' .. order[j]
    end
    local read = redis.call('mget', unpack(names))
    for j = 1, #names do
      look(order[at + j - 1], read[j])
    end
    at = at + 32
  end
end
if #slots < want or (top > limit and live + want > limit) then
  return {0, -1}
end

-- The token: the clock (us), forced above the fence key and above each chosen slot's
-- last token (state.lua's next_token over several states).
local now = redis.call('time')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local floor = tonumber(got[3] or 0)
for k = 1, #slots do
  local state = states[k]
  if state then
    local last = tonumber(string.match(state, '^|%d+|(%d+)$') or 0)
    if last > floor then
      floor = last
    end
  end
end
if token <= floor then
  token = floor + 1
end
local text = string.format('%d', token)
for k = 1, #slots do
  local state = states[k]
  local epoch = state and string.match(state, '^|(%d+)|') or text
  redis.call('set', base .. ':s:' .. slots[k], field .. '|' .. want .. '|' .. text .. '|' .. epoch
    .. '|', 'px', ARGV[3])
end
if ARGV[8] == '1' or #slots > 1 or slots[1] ~= tonumber(ARGV[5]) then
  redis.call('set', KEYS[3], '=' .. text .. '|' .. table.concat(slots, ','), 'px', ARGV[7])
end
if ARGV[6] == '-1' then
  redis.call('set', KEYS[2], text)
elseif ARGV[6] ~= '0' then
  redis.call('set', KEYS[2], text, 'px', ARGV[6])
end
-- The meta key: rewritten only when this lease would outlast it (10 s of slack, so that
-- grants in a row rewrite it once), or when a lowered limit's last slot above it is gone.
local now_ms = math.floor(tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000)
local ends = now_ms + tonumber(ARGV[3])
if top > limit and highest <= limit then
  top = limit
  until_ms = 0
end
if until_ms < ends then
  redis.call('set', KEYS[1], limit .. '|' .. top .. '||' .. (ends + 10000), 'px',
    ends + 10000 - now_ms)
end
local reply = {token}
for k = 1, #slots do
  reply[k + 1] = slots[k]
end
return reply
