-- The runtime overrides' changes (overrides.go): one change of the hash of
-- the overrides, the increment of their version and its notice, at once.
--
-- KEYS[1]: the hash of the overrides (engine.OverridesKey)
-- KEYS[2]: their version (engine.OverridesVersionKey)
-- ARGV[1]: the operation: "put", "delete", "purge" or "poll"
-- ARGV[2]: the override's ID (its field); ARGV[3]: its record (put), or
--          the record it must still be (purge)
-- ARGV[4]: the channel of the notices (engine.OverridesChannel)
--
-- Reply: {the record before (nil: none), the version of the change (0:
-- nothing changed)}; for poll: {the version, Redis TIME's seconds and
-- microseconds}.
local op = ARGV[1]
if op == "poll" then
  local t = redis.call("TIME")
  return {tonumber(redis.call("GET", KEYS[2]) or "0"), t[1], t[2]}
end
local prev = redis.call("HGET", KEYS[1], ARGV[2])
if op == "put" then
  redis.call("HSET", KEYS[1], ARGV[2], ARGV[3])
elseif op == "delete" then
  if not prev then
    return {false, 0}
  end
  redis.call("HDEL", KEYS[1], ARGV[2])
elseif op == "purge" then
  if prev ~= ARGV[3] then
    return {false, 0}
  end
  redis.call("HDEL", KEYS[1], ARGV[2])
else
  return redis.error_reply("overrides.lua: unknown operation " .. tostring(op))
end
local v = redis.call("INCR", KEYS[2])
redis.call("PUBLISH", ARGV[4], v .. " " .. ARGV[2])
return {prev, v}
