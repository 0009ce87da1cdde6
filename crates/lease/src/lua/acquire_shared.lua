-- Acquire a permit of a semaphore or a read/write lease, or tell the caller why not. Runs after
-- fence.lua and shared.lua.
-- KEYS[1] lease hash   KEYS[2] fencing counter of the resource's bucket   KEYS[3] the head of the
-- line: the one waiter the others must not pass, `<holder field>` with its own PX expiry.
-- ARGV[1] bound owner   ARGV[2] operation id   ARGV[3] ttl ms   ARGV[4] shape (1 semaphore,
-- 2 read/write)   ARGV[5] permits of the semaphore (0 for read/write)   ARGV[6] permits to take (1
-- for read/write)   ARGV[7] mode p, r or w   ARGV[8] when contended, stand at the head of the line
-- for this many ms (0: do not)
-- Reply {status, fence, remaining ms}: 1 acquired, 2 replayed (the same attempt already holds it;
-- TTL untouched), 0 contended (retry in about that long), or {4, shape, permits} (held as another
-- shape, or as a semaphore of another size).
local refusal = fence_refusal(KEYS[2])
if refusal then
  return refusal
end
local meta = redis.call('HMGET', KEYS[1], 'owner', 'shape', 'permits')
if meta[1] and (meta[1] ~= SHARED or meta[2] ~= ARGV[4] or meta[3] ~= ARGV[5]) then
  return shape_conflict(KEYS[1])
end
local now = now_ms()
local live = {}
if meta[1] then
  live = live_holders(KEYS[1], now, true)
end
local me = holder_field(ARGV[1], ARGV[2])
local _, mine = find(live, me)
if mine then
  return {2, mine.fence, mine.expiry - now}
end

-- Whom the request must wait for; `earliest` is the first of their expiries.
local earliest = nil
local function blocked_by(holder)
  if not earliest or holder.expiry < earliest then
    earliest = holder.expiry
  end
end
local taken = 0
for _, holder in ipairs(live) do
  taken = taken + holder.count
end
local fits
if ARGV[7] == 'p' then
  fits = taken + tonumber(ARGV[6]) <= tonumber(ARGV[5])
  if not fits then
    for _, holder in ipairs(live) do
      blocked_by(holder)
    end
  end
else
  -- A writer waits for everybody, a reader only for a writer.
  fits = true
  for _, holder in ipairs(live) do
    if ARGV[7] == 'w' or holder.mode == 'w' then
      fits = false
      blocked_by(holder)
    end
  end
end
-- Nobody passes the head of the line: this is what keeps a request for many permits, or a writer,
-- from starving behind a stream of smaller requests or readers.
local head = redis.call('GET', KEYS[3])
if head and head ~= me then
  fits = false
  local pttl = redis.call('PTTL', KEYS[3])
  if not earliest or now + pttl < earliest then
    earliest = now + pttl
  end
end

if fits then
  if not meta[1] then
    redis.call('HSET', KEYS[1], 'owner', SHARED, 'shape', ARGV[4], 'permits', ARGV[5])
  end
  local holder = {field = me, fence = next_fence(KEYS[2]), expiry = now + tonumber(ARGV[3]),
    count = tonumber(ARGV[6]), mode = ARGV[7]}
  store(KEYS[1], holder)
  live[#live + 1] = holder
  settle(KEYS[1], live)
  if head == me then
    redis.call('DEL', KEYS[3])
  end
  return {1, holder.fence, tonumber(ARGV[3])}
end
if tonumber(ARGV[8]) > 0 and (not head or head == me) then
  redis.call('SET', KEYS[3], me, 'PX', ARGV[8])
end
if meta[1] then
  settle(KEYS[1], live)
end
return {0, 0, math.max((earliest or now) - now, 1)}
