-- release.lua: undoes what decide.lua reserved on one cluster node when the
-- request, spread over several nodes, turned out to be denied elsewhere.
-- Every operation is a delta, so consumption by other requests since the
-- reservation stays counted. Part of the library with prelude.lua.
--
-- keys[1]: a key of the node (routing only).
-- args: the instant in microseconds or "", then operations (the UNDO_*
-- codes of the prelude), each as
--   UNDO_WINDOW key start window span delta
--                                    take delta hits off the window counter's count when
--                                    its window still starts at start, off its previous
--                                    window's when it starts a window later (never below 0);
--                                    a count expires span windows after its window starts
--   UNDO_TAT key delta               token bucket TAT (now when absent or past) += delta µs
--                                    (dropped when not in the future)
--   UNDO_ZREM key count members...   ZREM the members
--   UNDO_ZADD key window count (score member)...
--                                    ZADD back popped entries still in the window
--   UNDO_PUBLISH base                PUBLISH base on <prefix>freed (after the others:
--                                    other processes drop their cached denials of it)
-- where count is the number of following arguments of the operation.

-- release_entry is the FCALL entry point.
local function release_entry(_, args)
  bind()
  pad_for(args[1])
  local now = instant_of(args[1])
  local logs, logged = {}, {} -- the sliding logs changed, whose totals are counted again at the end
  local function changed_log(key)
    if not logged[key] then
      logs[#logs + 1], logged[key] = key, true
    end
  end

  local i = 2
  while i <= #args do
    local op, key = args[i], args[i + 1]
    if op == UNDO_WINDOW then
      local start, w, span, delta = tonumber(args[i + 2]), tonumber(args[i + 3]), tonumber(args[i + 4]), tonumber(args[i + 5])
      local wkey = window_key(key)
      local s, count, prev = window_read(call('GET', wkey), call('GET', key))
      if not s then
        s, count, prev = start, 0, 0 -- deleted by the request (a refund emptied it) or expired since
      end
      if s == start then
        count = max(0, count - delta)
      elseif s == start + w then
        prev = max(0, prev - delta)
      end
      local expires = window_expiry(s, count, prev, w, span)
      if s ~= start and s ~= start + w then
        -- that window is over: nothing is left to give back
      elseif expires > now then
        call('SET', wkey, window_value(s, prev), 'PX', ttl_ms(expires, now))
        if count > 0 then
          call('SET', key, fmt(count), 'PX', ttl_ms(expires, now))
        else
          call('DEL', key)
        end
      else
        call('DEL', key, wkey)
      end
      i = i + 6
    elseif op == UNDO_TAT then
      -- An absent or past TAT is a full bucket, i.e. now (as decide.lua
      -- loads it): undoing a refund that filled the bucket starts from there.
      local tat = max(tonumber(call('GET', key) or '0'), now) + tonumber(args[i + 2])
      if tat > now then
        call('SET', key, fmt(tat), 'PX', ttl_ms(tat, now))
      else
        call('DEL', key)
      end
      i = i + 3
    elseif op == UNDO_ZREM then
      local count = tonumber(args[i + 2])
      for j = 1, count do
        call('ZREM', key, args[i + 2 + j])
      end
      changed_log(key)
      i = i + 3 + count
    elseif op == UNDO_ZADD then
      local w, count = tonumber(args[i + 2]), tonumber(args[i + 3])
      local newest = 0
      for j = 1, count, 2 do
        local score = tonumber(args[i + 3 + j])
        if score > now - w then
          call('ZADD', key, score, args[i + 4 + j])
          newest = max(newest, score)
        end
      end
      if newest > 0 then
        local want = ttl_ms(newest + w, now)
        if call('PTTL', key) < tonumber(want) then
          call('PEXPIRE', key, want)
        end
      end
      changed_log(key)
      i = i + 4 + count
    elseif op == UNDO_PUBLISH then
      freed(key)
      i = i + 2
    else
      return redis.error_reply('rls: unknown release operation ' .. tostring(op))
    end
  end
  for l = 1, #logs do
    local key = logs[l]
    local total, entries = 0, call('ZRANGE', key, 0, -1)
    for j = 1, #entries do
      if entries[j] ~= LOG_TOTAL then
        total = total + log_hits(entries[j])
      end
    end
    if total == 0 then
      call('DEL', key)
    else
      call('ZADD', key, fmt(-total - 1), LOG_TOTAL)
    end
  end
  return 1
end
