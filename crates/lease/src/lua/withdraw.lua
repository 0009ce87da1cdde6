-- A waiter that gives up leaves the head of the line, if it stands there, and wakes the waiters
-- behind it. Runs after shared.lua. KEYS[1] the head of the line of a shared resource, KEYS[2] its
-- release channel; ARGV[1] bound owner, ARGV[2] operation id. Reply: 1 left it, 0 stood elsewhere.
if redis.call('GET', KEYS[1]) == holder_field(ARGV[1], ARGV[2]) then
  redis.call('DEL', KEYS[1])
  redis.call('SPUBLISH', KEYS[2], 'released')
  return 1
end
return 0
