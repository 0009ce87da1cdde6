-- Acquire a lease, or tell the caller why not. Atomic: one server execution.
-- KEYS[1] lease hash {owner, op, fence}   KEYS[2] fencing counter (never expires)
-- ARGV[1] bound owner   ARGV[2] operation id   ARGV[3] ttl in milliseconds
-- Reply {status, fence, remaining ms}: 1 acquired, 2 replayed (same attempt, TTL untouched),
-- 3 conflict (same owner, other operation), 0 contended (another owner).
local held = redis.call('HMGET', KEYS[1], 'owner', 'op', 'fence')
if not held[1] then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'op', ARGV[2], 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, fence, tonumber(ARGV[3])}
end
local fence = tonumber(held[3])
local remaining = redis.call('PTTL', KEYS[1])
if held[1] == ARGV[1] then
  if held[2] == ARGV[2] then
    return {2, fence, remaining}
  end
  return {3, fence, remaining}
end
return {0, fence, remaining}
