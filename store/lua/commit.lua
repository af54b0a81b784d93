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
--   type     'C' create | 'U' update | 'D' delete, an update's feed hint right after it
--            ('UR1764000000000': written to its feed entry as the field h; store/ops.py)
--   slot     k: which kind keys to use
--   kind     kind name, written to the feed
--   name     object name
--   expect   expected revision ('-' = any; ignored by create)
--   acct     '' | 'N <7 capacities>' node capacity | 'X' drop node capacity
--            | 'B <node> <pool> <cpu> <mem> <gpu>' bind claim | 'R' release claim
--
-- Returns one result per commit: {1, first_revision} or {0, op_index, code, detail...}.
--
-- Where the server's time goes: a redis.call costs several times the hash operation it runs
-- (its arguments made into objects, the command looked up and checked, its effect propagated
-- to the AOF and replicas one command at a time), and every table and string the script makes
-- is the Lua collector's work later. So the script reads what the call's commits will check
-- with one HMGET per hash up front, keeps the commits' writes in tables that the later commits
-- of the call check against, and writes each changed hash once at the end, then the feed: a
-- few commands per call and one XADD per written object, where it took ~7 commands per object.
-- The stored result, the feed and the replies are those of applying the commits one by one.

local CAPACITY_FIELDS = {'c.g.cpu', 'c.g.mem', 'c.g.gpu', 'c.be.cpu', 'c.be.mem', 'c.be.gpu', 'c.pods'}
local RESOURCES = {'cpu', 'mem', 'gpu'}
local CHUNK = 500 -- fields per HMGET/HSET/HDEL call, well below Lua's unpack limit

local argv, call, match, sub, format = ARGV, redis.call, string.match, string.sub, string.format
local ncommits = tonumber(argv[3])
local acct_key, claims_key = KEYS[4], KEYS[5]

-- Fencing: a leader-only write must carry the current epoch of a lease that has not expired.
if argv[1] ~= '' then
  local lease = call('HMGET', KEYS[3], 'epoch', 'expires_ms')
  local current = tonumber(lease[1] or '0')
  local t = call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if current ~= tonumber(argv[1]) or tonumber(lease[2] or '0') <= now_ms then
    local fenced = {}
    for c = 1, ncommits do fenced[c] = {0, 0, 'FENCED', tostring(current)} end
    return fenced
  end
end

-- A hash as this call sees it: `reads` holds the stored values read so far (false: absent),
-- `writes` this call's changes (false: deleted), written to the server at the end.
local function hash_view(key)
  return {key = key, reads = {}, writes = {}}
end

local function get(view, field)
  local value = view.writes[field]
  if value ~= nil then return value end
  local reads = view.reads
  value = reads[field]
  if value == nil then
    value = call('HGET', view.key, field)
    reads[field] = value
  end
  return value
end

-- Reads the listed fields, CHUNK fields an HMGET. Only before the first write to the view:
-- a field listed twice is read twice, the same stored value.
local function prefetch(view, fields)
  local reads = view.reads
  for i = 1, #fields, CHUNK do
    local last = math.min(#fields, i + CHUNK - 1)
    local got = call('HMGET', view.key, unpack(fields, i, last))
    for j = i, last do reads[fields[j]] = got[j - i + 1] end
  end
end

-- Writes the changed fields: HSET of those with a value (usage counts are numbers until
-- now), HDEL of those deleted.
local function flush(view)
  local sets, dels = {}, {}
  for f, value in pairs(view.writes) do
    if value then
      if type(value) == 'number' then value = format('%d', value) end
      sets[#sets + 1] = f
      sets[#sets + 1] = value
    else
      dels[#dels + 1] = f
    end
  end
  for i = 1, #sets, 2 * CHUNK do
    call('HSET', view.key, unpack(sets, i, math.min(#sets, i + 2 * CHUNK - 1)))
  end
  for i = 1, #dels, CHUNK do
    call('HDEL', view.key, unpack(dels, i, math.min(#dels, i + CHUNK - 1)))
  end
end

local acct, claims = hash_view(acct_key), hash_view(claims_key)
local data_views, rv_views = {}, {}

-- What a claim "<node> <pool> <cpu> <mem> <gpu>" counts on, in one flat table (one table, not
-- one per field: every table is the collector's work): node, pool, then per field counted (the
-- pod slot first, then each resource it asks any of) its label, usage field, capacity field and
-- amount.
local function claim_fields(node, pool, cpu, mem, gpu)
  local fields = {node, pool, 'pods', node .. '|u.pods', node .. '|c.pods', 1}
  local amounts = {tonumber(cpu), tonumber(mem), tonumber(gpu)}
  for j = 1, 3 do
    local amount = amounts[j]
    if amount > 0 then
      local r = RESOURCES[j]
      local n = #fields
      fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] =
        r, node .. '|u.' .. pool .. '.' .. r, node .. '|c.' .. pool .. '.' .. r, amount
    end
  end
  return fields
end

local function stored_claim_fields(claim)
  return claim_fields(match(claim, '^(%S+) (%S+) (%S+) (%S+) (%S+)'))
end

-- Parse every op first, so that the reads of all commits go in one HMGET per hash. Ops are
-- numbered across the call (k); their parts are kept in one array each.
local commit_start, commit_size, commit_reply = {}, {}, {}
local op_type, op_slot, op_kind, op_name, op_expect, op_acct, op_arg = {}, {}, {}, {}, {}, {}, {}
local op_hint = {} -- k -> an update's feed hint (most ops have none)
local op_bind, op_claim = {}, {} -- k -> a bind's claim_fields, and its claim
local nparsed = 0
do
  local pos = 4
  local rv_names, claim_names = {}, {}
  for c = 1, ncommits do
    local nops = tonumber(argv[pos])
    commit_start[c], commit_size[c] = nparsed + 1, nops
    for i = 1, nops do
      local b = pos + 2 * i - 1
      local header = argv[b]
      local optype, hint, slot, kind, name, expect, a =
        match(header, '^(%u)(%w*) (%S+) (%S+) (%S+) (%S+) ?(.*)$')
      if hint ~= '' and optype ~= 'U' then optype = nil end -- only an update says what it is
      local bind_node, pool, cpu, mem, gpu
      if optype and sub(a, 1, 1) == 'B' then
        bind_node, pool, cpu, mem, gpu = match(a, '^B (%S+) (%S+) (%d+) (%d+) (%d+)$')
        if not bind_node then optype = nil end
      end
      if not optype then
        commit_reply[c] = {0, i, 'MALFORMED', header}
        break
      end
      local k = nparsed + i
      slot = tonumber(slot)
      op_type[k], op_slot[k], op_kind[k], op_name[k], op_expect[k], op_acct[k], op_arg[k] =
        optype, slot, kind, name, expect, a, b + 1
      if hint ~= '' then op_hint[k] = hint end
      local names = rv_names[slot]
      if not names then
        names = {}
        rv_names[slot] = names
        data_views[slot] = hash_view(KEYS[4 + 2 * slot])
        rv_views[slot] = hash_view(KEYS[5 + 2 * slot])
      end
      names[#names + 1] = name
      if bind_node then
        op_bind[k], op_claim[k] = claim_fields(bind_node, pool, cpu, mem, gpu), sub(a, 3)
        claim_names[#claim_names + 1] = name
      elseif a == 'R' then
        claim_names[#claim_names + 1] = name
      end
    end
    nparsed = nparsed + nops
    pos = pos + 1 + 2 * nops
  end
  for slot, names in pairs(rv_names) do prefetch(rv_views[slot], names) end
  prefetch(claims, claim_names)
  -- The node fields binds check and releases return (a release's from its stored claim).
  local fields = {}
  for k = 1, nparsed do
    local bind = op_bind[k]
    local counted = bind
    if not bind and op_acct[k] == 'R' and claims.reads[op_name[k]] then
      counted = stored_claim_fields(claims.reads[op_name[k]])
    end
    if counted then
      for j = 3, #counted, 4 do
        fields[#fields + 1] = counted[j + 1]
        if bind then fields[#fields + 1] = counted[j + 2] end
      end
    end
  end
  prefetch(acct, fields)
end

local revision = tonumber(call('GET', KEYS[1]) or '0')
local first_revision = revision + 1
local fed, fed_data = {}, {} -- the feed's new entries in revision order: the op, a deletion's data

local function commit(c)
  local k0, nops = commit_start[c], commit_size[c]
  -- Pass 1: check everything. Usage added (or released) by earlier claims of this same commit is
  -- tracked locally so that two pods of one batch cannot share the last free slot.
  local seen = nops > 1 and {} or nil -- one op cannot appear twice
  local pending_use = nil
  for i = 1, nops do
    local k = k0 + i - 1
    local name = op_name[k]
    if seen then
      local id = op_kind[k] .. '/' .. name
      if seen[id] then return {0, i, 'DUPLICATE', id} end
      seen[id] = true
    end

    local current = get(rv_views[op_slot[k]], name)
    if op_type[k] == 'C' then
      if current then return {0, i, 'EXISTS'} end
    else
      if not current then return {0, i, 'NOTFOUND'} end
      local expect = op_expect[k]
      if expect ~= '-' and expect ~= current then return {0, i, 'CONFLICT', current} end
    end

    local bind = op_bind[k]
    if bind then
      local node = bind[1]
      local bound = get(claims, name)
      if bound then return {0, i, 'BOUND', match(bound, '^%S+')} end
      if not get(acct, bind[5]) then return {0, i, 'NONODE', node} end
      pending_use = pending_use or {}
      for j = 3, #bind, 4 do
        local used_field, want = bind[j + 1], bind[j + 3]
        local used = tonumber(get(acct, used_field) or '0') + (pending_use[used_field] or 0)
        local cap = tonumber(get(acct, bind[j + 2]) or '0')
        if used + want > cap then
          return {0, i, 'INSUFFICIENT', node, bind[2], bind[j], tostring(used), tostring(want), tostring(cap)}
        end
        pending_use[used_field] = (pending_use[used_field] or 0) + want
      end
    elseif op_acct[k] == 'R' then
      -- A claim released earlier in this commit is room for the binds after it: an eviction
      -- and its preemptor's bind commit together, never double-counting the node.
      local claim = get(claims, name)
      if claim then
        local f = stored_claim_fields(claim)
        pending_use = pending_use or {}
        for j = 3, #f, 4 do
          pending_use[f[j + 1]] = (pending_use[f[j + 1]] or 0) - f[j + 3]
        end
      end
    end
  end

  -- Pass 2: write (into the views; the server's hashes are written once the call is done).
  -- Revisions are assigned only now, so a rejected commit consumes none.
  local first = revision + 1
  revision = revision + nops
  for i = 1, nops do
    local k = k0 + i - 1
    local name, slot = op_name[k], op_slot[k]
    local data_writes, rv_writes = data_views[slot].writes, rv_views[slot].writes
    if op_type[k] == 'D' then
      fed_data[first + i - first_revision] = get(data_views[slot], name) or ''
      data_writes[name] = false
      rv_writes[name] = false
    else
      data_writes[name] = argv[op_arg[k]]
      rv_writes[name] = format('%d', first + i - 1)
    end

    local a = op_acct[k]
    local bind = op_bind[k]
    if bind then
      local usage = acct.writes
      for j = 4, #bind, 4 do
        usage[bind[j]] = tonumber(get(acct, bind[j]) or '0') + bind[j + 2]
      end
      claims.writes[name] = op_claim[k]
    elseif a == 'R' then
      local claim = get(claims, name)
      if claim then
        local usage, f = acct.writes, stored_claim_fields(claim)
        for j = 4, #f, 4 do
          usage[f[j]] = tonumber(get(acct, f[j]) or '0') - f[j + 2]
        end
        claims.writes[name] = false
      end
    elseif sub(a, 1, 1) == 'N' then
      local j = 0
      for value in string.gmatch(sub(a, 3), '%S+') do
        j = j + 1
        acct.writes[name .. '|' .. CAPACITY_FIELDS[j]] = value
      end
    elseif a == 'X' then
      for _, field in ipairs(CAPACITY_FIELDS) do
        acct.writes[name .. '|' .. field] = false
      end
    end
    fed[#fed + 1] = k
  end
  return {1, first}
end

local results = {}
for c = 1, ncommits do
  results[c] = commit_reply[c] or commit(c)
end

-- The writes: every changed hash once, the counter, then the feed in revision order.
for slot, rv in pairs(rv_views) do
  flush(data_views[slot])
  flush(rv)
end
flush(claims)
flush(acct)
-- The feed is trimmed once, after the call's entries, to the same approximate length as a trim
-- at every entry would leave (whole stream nodes, never below ARGV[2] entries).
if #fed > 0 then
  call('SET', KEYS[1], format('%d', revision))
  local feed = KEYS[2]
  local events = {C = 'A', U = 'M', D = 'D'}
  for j = 1, #fed do
    local k = fed[j]
    local hint = op_hint[k]
    if hint then
      call('XADD', feed, format('%d-0', first_revision + j - 1),
        't', 'M', 'k', op_kind[k], 'n', op_name[k], 'd', argv[op_arg[k]], 'h', hint)
    else
      call('XADD', feed, format('%d-0', first_revision + j - 1),
        't', events[op_type[k]] or 'M', 'k', op_kind[k], 'n', op_name[k], 'd', fed_data[j] or argv[op_arg[k]])
    end
  end
  call('XTRIM', feed, 'MAXLEN', '~', argv[2])
end
return results
