-- Read a lease without changing it. Runs after fence.lua and shared.lua. KEYS[1] lease hash,
-- KEYS[2] the resource's change channel; ARGV[1] bound owner, ARGV[2] operation id (both empty when
-- the caller names no attempt), ARGV[3] a watcher's marker, published on the channel in the same
-- atomic step as the read, so the watcher knows which announcements came before it (empty: none;
-- see watch.rs). Reply: {0} free, {1, fence, remaining ms, yours, value or nil}, or for a semaphore
-- or read/write lease what shared.lua's `shared_inspect` answers.
local held = redis.call('HMGET', KEYS[1], 'owner', 'op', 'fence', 'value')
if ARGV[3] ~= '' then
  redis.call('SPUBLISH', KEYS[2], 'sync:' .. ARGV[3])
end
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
return {1, tonumber(held[3]), redis.call('PTTL', KEYS[1]), yours, held[4]}
