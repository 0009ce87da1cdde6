-- Prelude of the scripts that hand out fences. Fences come from the counter of the resource's
-- bucket, shared with the other resources of the bucket (never expires; their number is bounded),
-- so fences rise per resource even though nothing of a resource is left once its leases are gone.
-- A counter that is not a whole number from 1 to 2^53 - 1 (what a Lua number holds exactly) refuses
-- the call with a `FENCE` error before anything is written: check with `fence_refusal` first, draw
-- with `next_fence` after. A missing counter starts at the server's clock in microseconds, so a
-- counter lost with the data (a flushed or restarted server without persistence) starts again above
-- every fence it handed out.
local function fence_of(text)
  local n = tonumber(text)
  if n and n >= 1 and n < 9007199254740992 and n == math.floor(n) then
    return n
  end
  return nil
end

-- The error to refuse with when the counter at `key` cannot give another fence, else nil.
local function fence_refusal(key)
  local counter = redis.call('GET', key)
  if counter and (not fence_of(counter) or fence_of(counter) >= 9007199254740991) then
    return redis.error_reply('FENCE counter ' .. key .. ' holds ' .. counter .. ', not a fence')
  end
  return nil
end

-- The next fence of the counter at `key` (checked by `fence_refusal` first).
local function next_fence(key)
  if redis.call('EXISTS', key) == 1 then
    return redis.call('INCR', key)
  end
  local now = redis.call('TIME')
  local start = now[1] .. string.format('%06d', tonumber(now[2]))
  redis.call('SET', key, start)
  return fence_of(start)
end

