-- release.lua: undoes what decide.lua reserved on one cluster node when the
-- request, spread over several nodes, turned out to be denied elsewhere.
-- Every operation is a delta, so consumption by other requests since the
-- reservation stays counted.
--
-- KEYS[1]: a key of the node (routing only).
-- ARGV: the instant in microseconds or "", then operations, each as
--   "I" key delta            INCRBY delta if the key still exists (never below 0)
--   "T" key delta            token bucket TAT (now when absent or past) += delta µs
--                            (dropped when not in the future)
--   "Z" key count members... ZREM the members
--   "A" key window count (score member)... ZADD back popped entries
--   "P" base                 PUBLISH base on <prefix>freed (after the others:
--                            other processes drop their cached denials of it)
-- where count is the number of following arguments of the operation.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fmt(x)
  return string.format('%.0f', x)
end

local i = 2
while i <= #ARGV do
  local op, key = ARGV[i], ARGV[i + 1]
  if op == 'I' then
    if redis.call('EXISTS', key) == 1 then
      local v = redis.call('INCRBY', key, ARGV[i + 2])
      if v < 0 then
        redis.call('SET', key, 0, 'KEEPTTL')
      end
    end
    i = i + 3
  elseif op == 'T' then
    -- An absent or past TAT is a full bucket, i.e. now (as decide.lua
    -- loads it): undoing a refund that filled the bucket starts from there.
    local tat = math.max(tonumber(redis.call('GET', key) or '0'), now) + tonumber(ARGV[i + 2])
    if tat > now then
      redis.call('SET', key, fmt(tat), 'PX', fmt(math.max(1, math.floor((tat - now + 999) / 1000))))
    else
      redis.call('DEL', key)
    end
    i = i + 3
  elseif op == 'Z' then
    local count = tonumber(ARGV[i + 2])
    for j = 1, count do
      redis.call('ZREM', key, ARGV[i + 2 + j])
    end
    i = i + 3 + count
  elseif op == 'P' then
    redis.pcall('PUBLISH', string.match(key, '^[^{]*') .. 'freed', key) -- see decide.lua's freed
    i = i + 2
  else -- 'A'
    local w, count = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    local newest = 0
    for j = 1, count, 2 do
      local score = tonumber(ARGV[i + 3 + j])
      if score > now - w then
        redis.call('ZADD', key, score, ARGV[i + 4 + j])
        newest = math.max(newest, score)
      end
    end
    if newest > 0 then
      local want = math.max(1, math.floor((newest + w - now + 999) / 1000))
      if redis.call('PTTL', key) < want then
        redis.call('PEXPIRE', key, fmt(want))
      end
    end
    i = i + 4 + count
  end
end
return 1
