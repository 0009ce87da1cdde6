-- A waiter that gives up leaves the head of the line, if it stands there. Runs after shared.lua.
-- KEYS[1] the head of the line of a shared resource; ARGV[1] bound owner, ARGV[2] operation id.
-- Reply: 1 left it, 0 stood elsewhere.
if redis.call('GET', KEYS[1]) == holder_field(ARGV[1], ARGV[2]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
