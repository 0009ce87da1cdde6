-- Acquire a lease, or tell the caller why not. Atomic: one server execution. Runs after fence.lua
-- and shared.lua.
-- KEYS[1] lease hash {owner, op, fence[, value]}   KEYS[2] fencing counter of the resource's bucket
-- KEYS[3] the resource's change channel: a new holding is announced there in the same atomic step
-- (`acquired:<fence>:<ttl ms>[:<value>]`, read by watchers, see watch.rs).
-- ARGV[1] bound owner   ARGV[2] operation id   ARGV[3] ttl in milliseconds
-- ARGV[4] (optional) the holder's value, kept with the lease (leader election: the leader's address)
-- Reply {status, fence, remaining ms}: 1 acquired, 2 replayed (same attempt, TTL untouched),
-- 3 conflict (same owner, other operation), 0 contended (another owner), 4 the resource is held as
-- a semaphore or read/write lease ({4, shape, permits, remaining}, see shared.lua).
local held = redis.call('HMGET', KEYS[1], 'owner', 'op', 'fence')
if held[1] == SHARED then
  return shape_conflict(KEYS[1])
end
if not held[1] then
  local refusal = fence_refusal(KEYS[2])
  if refusal then
    return refusal
  end
  local fence = next_fence(KEYS[2])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'op', ARGV[2], 'fence', fence)
  local announced = 'acquired:' .. string.format('%d', fence) .. ':' .. ARGV[3]
  if ARGV[4] then
    redis.call('HSET', KEYS[1], 'value', ARGV[4])
    announced = announced .. ':' .. ARGV[4]
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('SPUBLISH', KEYS[3], announced)
  return {1, fence, tonumber(ARGV[3])}
end
local fence = fence_of(held[3])
if not fence then
  return redis.error_reply('FENCE lease ' .. KEYS[1] .. ' holds fence ' .. tostring(held[3]) .. ', not a fence')
end
local remaining = redis.call('PTTL', KEYS[1])
if held[1] == ARGV[1] then
  if held[2] == ARGV[2] then
    return {2, fence, remaining}
  end
  return {3, fence, remaining}
end
return {0, fence, remaining}
