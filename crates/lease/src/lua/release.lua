-- Release a lease the caller holds and wake one waiter. Runs after fence.lua and shared.lua.
-- KEYS[1] lease hash, KEYS[2] the resource's change channel (same hash slot, so SPUBLISH is legal
-- in a cluster), told `released:<fence>` (a shared resource's release tells it a plain `released`);
-- ARGV[1] bound owner, ARGV[2] operation id.
-- Reply: 1 released, 0 already absent, -1 held by another attempt.
local held = redis.call('HMGET', KEYS[1], 'owner', 'op', 'fence')
if held[1] == SHARED then
  return shared_release(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
if not held[1] then
  return 0
end
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return -1
end
redis.call('DEL', KEYS[1])
redis.call('SPUBLISH', KEYS[2], 'released:' .. held[3])
return 1
