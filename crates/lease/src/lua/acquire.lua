-- Acquire a lease, or tell the caller why not. Atomic: one server execution.
-- KEYS[1] lease hash {owner, op, fence}   KEYS[2] fencing counter of the resource's bucket, shared
-- with the other resources of the bucket (never expires; their number is bounded), so fences rise
-- per resource even though nothing of a resource is left once its lease is gone.
-- KEYS[3] the resource's change channel: a new holding is announced there in the same atomic step
-- (`acquired:<fence>:<ttl ms>[:<value>]`, read by watchers, see watch.rs).
-- ARGV[1] bound owner   ARGV[2] operation id   ARGV[3] ttl in milliseconds
-- ARGV[4] (optional) the holder's value, kept with the lease (leader election: the leader's address)
-- Reply {status, fence, remaining ms}: 1 acquired, 2 replayed (same attempt, TTL untouched),
-- 3 conflict (same owner, other operation), 0 contended (another owner).
-- A counter or held fence that is not a whole number from 1 to 2^53 - 1 (what a Lua number holds
-- exactly) refuses the call with a `FENCE` error before anything is written. A missing counter
-- starts at the server's clock in microseconds, so a counter lost with the data (a flushed or
-- restarted server without persistence) starts again above every fence it handed out.
local function fence_of(text)
  local n = tonumber(text)
  if n and n >= 1 and n < 9007199254740992 and n == math.floor(n) then
    return n
  end
  return nil
end

local held = redis.call('HMGET', KEYS[1], 'owner', 'op', 'fence')
if not held[1] then
  local counter = redis.call('GET', KEYS[2])
  local fence
  if counter then
    if not fence_of(counter) or fence_of(counter) >= 9007199254740991 then
      return redis.error_reply('FENCE counter ' .. KEYS[2] .. ' holds ' .. counter .. ', not a fence')
    end
    fence = redis.call('INCR', KEYS[2])
  else
    local now = redis.call('TIME')
    local start = now[1] .. string.format('%06d', tonumber(now[2]))
    redis.call('SET', KEYS[2], start)
    fence = fence_of(start)
  end
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
