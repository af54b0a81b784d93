-- Node heartbeats, kept like Kubernetes node leases: one field per node in a hash outside the
-- change feed, so thousands of heartbeats a second cost a hash write each and wake no watcher.
-- Time is the server's clock, so the agents' and the controller's clocks never matter.
--
-- KEYS[1] heartbeat hash   KEYS[2] the versions hash of the objects stamped (Nodes, or
-- SchedulerInstances): an object exists while it has a version
-- ARGV[1] 'record' | 'read' | 'forget'   ARGV[2..] node names (record, forget)
--
-- record: stamps every named node that exists; returns {now_ms, missing name, ...}
-- read:   returns {now_ms, name, ms, name, ms, ...}
-- stale:  ARGV[2] an age in ms, ARGV[3..] node names; returns {now_ms, fields in the hash,
--         count of stale pairs, name, ms (older than the age) ..., then name, ms of each named
--         node that has a stamp}: a controller's tick moves only what it acts on
-- forget: drops the named fields; returns {now_ms}

local beats, nodes, action = KEYS[1], KEYS[2], ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local CHUNK = 500 -- fields per HSET/HDEL call, well below Lua's unpack limit

if action == 'record' then
  -- Which nodes exist: one HMGET of their versions per CHUNK names (a call per name cost
  -- several times the lookup it made).
  local missing, args = {now}, {}
  for i = 2, #ARGV, CHUNK do
    local last = math.min(#ARGV, i + CHUNK - 1)
    local versions = redis.call('HMGET', nodes, unpack(ARGV, i, last))
    for j = i, last do
      local name = ARGV[j]
      if versions[j - i + 1] then
        args[#args + 1] = name
        args[#args + 1] = now
      else
        missing[#missing + 1] = name
      end
    end
    if #args > 0 then
      redis.call('HSET', beats, unpack(args))
      args = {}
    end
  end
  return missing
elseif action == 'read' then
  local out = redis.call('HGETALL', beats)
  table.insert(out, 1, now)
  return out
elseif action == 'stale' then
  local cutoff = now - tonumber(ARGV[2])
  local all = redis.call('HGETALL', beats)
  local stale = {}
  for i = 1, #all, 2 do
    if tonumber(all[i + 1]) < cutoff then
      stale[#stale + 1] = all[i]
      stale[#stale + 1] = all[i + 1]
    end
  end
  local out = {now, #all / 2, #stale / 2}
  for i = 1, #stale do
    out[#out + 1] = stale[i]
  end
  for i = 3, #ARGV do
    local ms = redis.call('HGET', beats, ARGV[i])
    if ms then
      out[#out + 1] = ARGV[i]
      out[#out + 1] = ms
    end
  end
  return out
elseif action == 'forget' then
  for i = 2, #ARGV, CHUNK do
    redis.call('HDEL', beats, unpack(ARGV, i, math.min(#ARGV, i + CHUNK - 1)))
  end
  return {now}
end
return redis.error_reply('unknown heartbeat action ' .. tostring(action))
