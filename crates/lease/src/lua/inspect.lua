-- Read a lease without changing it. KEYS[1] lease hash; ARGV[1] bound owner, ARGV[2] operation id
-- (both empty when the caller names no attempt). Reply: {0} free, {1, fence, remaining ms, yours},
-- or for a semaphore or read/write lease what shared.lua's `shared_inspect` answers.
local held = redis.call('HMGET', KEYS[1], 'owner', 'op', 'fence')
if held[1] == SHARED then
  return shared_inspect(KEYS[1], ARGV[1], ARGV[2])
end
if not held[1] then
  return {0}
end
local yours = 0
if held[1] == ARGV[1] and held[2] == ARGV[2] then
  yours = 1
end
return {1, tonumber(held[3]), redis.call('PTTL', KEYS[1]), yours}
