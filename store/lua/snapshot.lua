-- A consistent snapshot of one cluster's keys: every key matching ARGV[1] with its remaining
-- time to live (ms, -1 for none) and its DUMP payload, in one script run, so no write lands
-- between two keys. Returns a flat array: the revision (the value of key ARGV[2]), then key,
-- pttl, payload, key, pttl, payload, ... (SCAN may name a key twice; the caller keeps one.)
local out = {redis.call("GET", ARGV[2]) or "0"}
local cursor = "0"
repeat
  local reply = redis.call("SCAN", cursor, "MATCH", ARGV[1], "COUNT", 1000)
  cursor = reply[1]
  for _, key in ipairs(reply[2]) do
    out[#out + 1] = key
    out[#out + 1] = redis.call("PTTL", key)
    out[#out + 1] = redis.call("DUMP", key)
  end
until cursor == "0"
return out
