-- Extend a lease the caller holds. KEYS[1] lease hash; ARGV[1] bound owner, ARGV[2] operation id,
-- ARGV[3] ttl in milliseconds. Reply: 1 renewed, 0 absent, -1 held by another attempt.
local held = redis.call('HMGET', KEYS[1], 'owner', 'op')
if held[1] == SHARED then
  return shared_renew(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
end
if not held[1] then
  return 0
end
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
