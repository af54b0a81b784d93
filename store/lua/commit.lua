-- Atomic multi-object commits. One call carries one or more independent commits (a pipeline
-- of commits in one round trip); each commit runs every check first, then every write, so a
-- failed check writes nothing of that commit and leaves the others unaffected. One global revision per written object; each write appends to the change feed with
-- the stream ID "<revision>-0", so revisions in the feed are dense and a gap means "trimmed".
--
-- KEYS[1] revision counter      KEYS[2] change feed (stream)     KEYS[3] lease hash (fencing)
-- KEYS[4] node accounting hash  KEYS[5] pod claims hash
-- KEYS[4+2k], KEYS[5+2k]        data hash and revision hash of the k-th kind used (k >= 1)
--
-- ARGV[1] fencing epoch ('' = not fenced)   ARGV[2] feed max length   ARGV[3] number of commits
-- then per commit: its number of ops, followed by 2 arguments per op: a header
-- "<type> <slot> <kind> <name> <expect> <acct>" (space-separated; names never contain spaces)
-- and the serialised object ('' for delete). Fields of the header:
--   type     'C' create | 'U' update | 'D' delete
--   slot     k: which kind keys to use
--   kind     kind name, written to the feed
--   name     object name
--   expect   expected revision ('-' = any; ignored by create)
--   acct     '' | 'N <7 capacities>' node capacity | 'X' drop node capacity
--            | 'B <node> <pool> <cpu> <mem> <gpu>' bind claim | 'R' release claim
--
-- Returns one result per commit: {1, first_revision} or {0, op_index, code, detail...}.

local OP_FIELDS = 2
local RESOURCES = {'cpu', 'mem', 'gpu'}
local CAPACITY_FIELDS = {'c.g.cpu', 'c.g.mem', 'c.g.gpu', 'c.be.cpu', 'c.be.mem', 'c.be.gpu', 'c.pods'}

local ncommits = tonumber(ARGV[3])
local acct_key, claims_key = KEYS[4], KEYS[5]
local maxlen = ARGV[2]

-- Fencing: a leader-only write must carry the current epoch of a lease that has not expired.
if ARGV[1] ~= '' then
  local lease = redis.call('HMGET', KEYS[3], 'epoch', 'expires_ms')
  local current = tonumber(lease[1] or '0')
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if current ~= tonumber(ARGV[1]) or tonumber(lease[2] or '0') <= now_ms then
    local fenced = {}
    for c = 1, ncommits do fenced[c] = {0, 0, 'FENCED', tostring(current)} end
    return fenced
  end
end

local function split(s)
  local out = {}
  for w in string.gmatch(s, '%S+') do out[#out + 1] = w end
  return out
end

local function commit(base, nops)
  -- Pass 1: check everything. Usage added (or released) by earlier claims of this same commit is
  -- tracked locally so that two pods of one batch cannot share the last free slot.
  local ops = {}
  local seen = {}
  local pending_use = {}
  for i = 1, nops do
    local b = base + (i - 1) * OP_FIELDS
    local type, slot, kind, name, expect, acct =
      string.match(ARGV[b + 1], '^(%S+) (%S+) (%S+) (%S+) (%S+) ?(.*)$')
    if not type then return {0, i, 'MALFORMED', ARGV[b + 1]} end
    local op = {
      type = type, slot = tonumber(slot), kind = kind, name = name, expect = expect,
      data = ARGV[b + 2], acct = acct,
    }
    op.data_key = KEYS[4 + 2 * op.slot]
    op.rv_key = KEYS[5 + 2 * op.slot]
    local id = op.kind .. '/' .. op.name
    if seen[id] then return {0, i, 'DUPLICATE', id} end
    seen[id] = true

    local current = redis.call('HGET', op.rv_key, op.name)
    if op.type == 'C' then
      if current then return {0, i, 'EXISTS'} end
    else
      if not current then return {0, i, 'NOTFOUND'} end
      if op.expect ~= '-' and op.expect ~= current then return {0, i, 'CONFLICT', current} end
    end

    local a = op.acct
    if string.sub(a, 1, 1) == 'B' then
      local f = split(a)
      local node, pool = f[2], f[3]
      local bound = redis.call('HGET', claims_key, op.name)
      if bound then return {0, i, 'BOUND', split(bound)[1]} end
      if not redis.call('HGET', acct_key, node .. '|c.pods') then return {0, i, 'NONODE', node} end
      local want = {cpu = tonumber(f[4]), mem = tonumber(f[5]), gpu = tonumber(f[6])}
      local checks = {{'pods', node .. '|u.pods', node .. '|c.pods', 1}}
      for _, r in ipairs(RESOURCES) do
        if want[r] > 0 then
          checks[#checks + 1] = {r, node .. '|u.' .. pool .. '.' .. r, node .. '|c.' .. pool .. '.' .. r, want[r]}
        end
      end
      for _, c in ipairs(checks) do
        local used = tonumber(redis.call('HGET', acct_key, c[2]) or '0') + (pending_use[c[2]] or 0)
        local cap = tonumber(redis.call('HGET', acct_key, c[3]) or '0')
        if used + c[4] > cap then
          return {0, i, 'INSUFFICIENT', node, pool, c[1], tostring(used), tostring(c[4]), tostring(cap)}
        end
        pending_use[c[2]] = (pending_use[c[2]] or 0) + c[4]
      end
      op.claim = node .. ' ' .. pool .. ' ' .. f[4] .. ' ' .. f[5] .. ' ' .. f[6]
    elseif a == 'R' then
      -- A claim released earlier in this commit is room for the binds after it: an eviction
      -- and its preemptor's bind commit together, never double-counting the node.
      local claim = redis.call('HGET', claims_key, op.name)
      if claim then
        local f = split(claim)
        local node, pool = f[1], f[2]
        local key = node .. '|u.pods'
        pending_use[key] = (pending_use[key] or 0) - 1
        for j, r in ipairs(RESOURCES) do
          local amount = tonumber(f[2 + j])
          if amount > 0 then
            key = node .. '|u.' .. pool .. '.' .. r
            pending_use[key] = (pending_use[key] or 0) - amount
          end
        end
      end
    end
    ops[i] = op
  end

  -- Pass 2: write. Revisions are assigned only now, so a rejected commit consumes none.
  local last = redis.call('INCRBY', KEYS[1], nops)
  local first = last - nops + 1
  for i = 1, nops do
    local op = ops[i]
    local rev = first + i - 1
    local event, data = 'M', op.data
    if op.type == 'D' then
      event = 'D'
      data = redis.call('HGET', op.data_key, op.name) or ''
      redis.call('HDEL', op.data_key, op.name)
      redis.call('HDEL', op.rv_key, op.name)
    else
      if op.type == 'C' then event = 'A' end
      redis.call('HSET', op.data_key, op.name, data)
      redis.call('HSET', op.rv_key, op.name, rev)
    end

    local a = op.acct
    local tag = string.sub(a, 1, 1)
    if tag == 'N' then
      local f = split(a)
      local node = op.name
      for j, field in ipairs(CAPACITY_FIELDS) do
        redis.call('HSET', acct_key, node .. '|' .. field, f[j + 1])
      end
    elseif tag == 'X' then
      for _, field in ipairs(CAPACITY_FIELDS) do
        redis.call('HDEL', acct_key, op.name .. '|' .. field)
      end
    elseif tag == 'B' then
      local f = split(op.claim)
      local node, pool = f[1], f[2]
      redis.call('HINCRBY', acct_key, node .. '|u.pods', 1)
      for j, r in ipairs(RESOURCES) do
        local amount = tonumber(f[2 + j])
        if amount > 0 then redis.call('HINCRBY', acct_key, node .. '|u.' .. pool .. '.' .. r, amount) end
      end
      redis.call('HSET', claims_key, op.name, op.claim)
    elseif tag == 'R' then
      local claim = redis.call('HGET', claims_key, op.name)
      if claim then
        local f = split(claim)
        local node, pool = f[1], f[2]
        redis.call('HINCRBY', acct_key, node .. '|u.pods', -1)
        for j, r in ipairs(RESOURCES) do
          local amount = tonumber(f[2 + j])
          if amount > 0 then redis.call('HINCRBY', acct_key, node .. '|u.' .. pool .. '.' .. r, -amount) end
        end
        redis.call('HDEL', claims_key, op.name)
      end
    end

    redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, rev .. '-0', 't', event, 'k', op.kind, 'n', op.name, 'd', data)
  end
  return {1, first}
end

local results = {}
local pos = 4
for c = 1, ncommits do
  local nops = tonumber(ARGV[pos])
  results[c] = commit(pos, nops)
  pos = pos + 1 + nops * OP_FIELDS
end
return results
