-- Prelude of every lease script: shared resources, semaphores and read/write leases. Their lease
-- hash holds `owner` = SHARED (no bound owner can equal it: those start with a digit), so a script
-- that knows only exclusive leases sees a resource held by somebody else and takes nothing; `shape`
-- (1 semaphore, 2 read/write); `permits` (semaphores); and one field per holder,
-- `h <bound owner> <operation id>` = `<fence> <expiry, server ms> <permits taken> <mode>` with mode
-- p (a permit), r (reader) or w (writer). Each holder is a lease of its own: its expiry is checked
-- against the server's clock by every script, so an expired holder counts for nothing even before
-- it is pruned, and the hash itself expires with its last holder (PEXPIREAT the latest expiry).
local SHARED = 'shared'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function holder_field(owner, op)
  return 'h ' .. owner .. ' ' .. op
end

-- The live holders of the hash at `key` as of `now`; with `prune`, expired ones are deleted.
local function live_holders(key, now, prune)
  local all = redis.call('HGETALL', key)
  local live = {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'h ' then
      local fence, expiry, count, mode = string.match(all[i + 1], '^(%d+) (%d+) (%d+) (%a)$')
      expiry = tonumber(expiry)
      if expiry and expiry > now then
        live[#live + 1] = {field = all[i], fence = tonumber(fence), expiry = expiry,
          count = tonumber(count), mode = mode}
      elseif prune then
        redis.call('HDEL', key, all[i])
      end
    end
  end
  return live
end

local function find(live, field)
  for index, holder in ipairs(live) do
    if holder.field == field then
      return index, holder
    end
  end
  return nil
end

local function store(key, holder)
  redis.call('HSET', key, holder.field,
    string.format('%d %d %d %s', holder.fence, holder.expiry, holder.count, holder.mode))
end

-- The hash lives exactly as long as its longest-lived holder; with none left it goes at once.
local function settle(key, live)
  local last = 0
  for _, holder in ipairs(live) do
    if holder.expiry > last then
      last = holder.expiry
    end
  end
  if last == 0 then
    redis.call('DEL', key)
  else
    redis.call('PEXPIREAT', key, string.format('%d', last))
  end
end

-- {4, shape, permits}: what a caller asking for another shape is told (shape 0: exclusive).
local function shape_conflict(key)
  local meta = redis.call('HMGET', key, 'owner', 'shape', 'permits')
  if meta[1] ~= SHARED then
    return {4, 0, 0}
  end
  return {4, tonumber(meta[2]) or 0, tonumber(meta[3]) or 0}
end

-- RENEW of a shared holder: 1 renewed, 0 absent (expired, released, never held).
local function shared_renew(key, owner, op, ttl)
  local now = now_ms()
  local live = live_holders(key, now, true)
  local _, holder = find(live, holder_field(owner, op))
  if not holder then
    settle(key, live)
    return 0
  end
  holder.expiry = now + tonumber(ttl)
  store(key, holder)
  settle(key, live)
  return 1
end

-- RELEASE of a shared holder, waking the waiters: 1 released, 0 absent.
local function shared_release(key, channel, owner, op)
  local live = live_holders(key, now_ms(), true)
  local index = find(live, holder_field(owner, op))
  if not index then
    settle(key, live)
    return 0
  end
  redis.call('HDEL', key, live[index].field)
  table.remove(live, index)
  settle(key, live)
  redis.call('SPUBLISH', channel, 'released')
  return 1
end

-- INSPECT of a shared resource, changing nothing: {2, shape, permits, then per live holder fence,
-- remaining ms, permits taken, mode (0 permit, 1 reader, 2 writer), yours}.
local function shared_inspect(key, owner, op)
  local now = now_ms()
  local meta = redis.call('HMGET', key, 'shape', 'permits')
  local reply = {2, tonumber(meta[1]) or 0, tonumber(meta[2]) or 0}
  local mine = holder_field(owner, op)
  local modes = {p = 0, r = 1, w = 2}
  for _, holder in ipairs(live_holders(key, now, false)) do
    local yours = 0
    if holder.field == mine then
      yours = 1
    end
    for _, value in ipairs({holder.fence, holder.expiry - now, holder.count, modes[holder.mode] or 0, yours}) do
      reply[#reply + 1] = value
    end
  end
  return reply
end

