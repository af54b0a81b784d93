-- Leader leases with fencing epochs. Time is the server's clock, so clients' clocks never matter.
-- The epoch only ever increases: each new holder gets epoch + 1, and commit.lua rejects fenced
-- writes whose epoch is not the current one.
--
-- KEYS[1] lease hash
-- ARGV[1] 'acquire' | 'renew' | 'release' | 'observe'   ARGV[2] holder   ARGV[3] epoch (renew, release)
-- ARGV[4] duration in ms (acquire, renew)   ARGV[5] holder address (acquire)
--
-- Returns {ok, holder, address, epoch, duration_ms, acquired_ms, renewed_ms, expires_ms, now_ms}.

local key, action, holder = KEYS[1], ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call('HMGET', key, 'holder', 'epoch', 'expires_ms')
local cur_holder, cur_epoch, expires = cur[1] or '', tonumber(cur[2] or '0'), tonumber(cur[3] or '0')
local live = cur_holder ~= '' and expires > now
local ok = 0

if action == 'acquire' then
  local duration = tonumber(ARGV[4])
  if live and cur_holder == holder then
    -- The holder asking again (its renewal's reply lost, say): the same epoch, at the address
    -- it gives now.
    redis.call('HSET', key, 'address', ARGV[5], 'renewed_ms', now, 'expires_ms', now + duration,
      'duration_ms', duration)
    ok = 1
  elseif not live then
    redis.call('HINCRBY', key, 'epoch', 1)
    redis.call('HSET', key, 'holder', holder, 'address', ARGV[5], 'duration_ms', duration,
      'acquired_ms', now, 'renewed_ms', now, 'expires_ms', now + duration)
    ok = 1
  end
elseif action == 'renew' then
  local duration = tonumber(ARGV[4])
  if live and cur_holder == holder and cur_epoch == tonumber(ARGV[3]) then
    redis.call('HSET', key, 'renewed_ms', now, 'expires_ms', now + duration, 'duration_ms', duration)
    ok = 1
  end
elseif action == 'release' then
  if cur_holder == holder and cur_epoch == tonumber(ARGV[3]) then
    redis.call('HSET', key, 'holder', '', 'expires_ms', 0)
    ok = 1
  end
elseif action ~= 'observe' then
  return redis.error_reply('unknown lease action ' .. action)
end

local h = redis.call('HMGET', key, 'holder', 'address', 'epoch', 'duration_ms', 'acquired_ms',
  'renewed_ms', 'expires_ms')
return {ok, h[1] or '', h[2] or '', tonumber(h[3] or '0'), tonumber(h[4] or '0'),
  tonumber(h[5] or '0'), tonumber(h[6] or '0'), tonumber(h[7] or '0'), now}
