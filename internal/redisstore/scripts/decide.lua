-- decide.lua: judges every limit of one request at one instant and consumes
-- all of them or none. It is engine.Evaluate (internal/engine/evaluate.go)
-- over the algorithms of internal/engine/algorithms.go, step for step and
-- with the same arithmetic: integers stay below 2^53 (exact in Lua numbers),
-- and the sliding window's float estimate uses the same IEEE-754 operations
-- in the same order. A differential test holds the two to identical answers.
--
-- One call decides several requests, one after the other, each whole: the
-- store sends the requests that arrive together in one EVALSHA, so that
-- the script's fixed cost (the call, TIME, its closures and tables) is paid
-- once per batch rather than once per request.
--
-- KEYS[1]: a key of the node (cluster routing only; every key is in ARGV).
-- ARGV[1]: the number of requests; then per request:
--   mode, "F" (final: the whole request), "M" (final, and all its keys may
--         be read with one MGET: a single node, or a single cluster slot) or
--         "R" (reserve: this node's part of a request spread over cluster
--         nodes; quota groups are judged locally and the undo log of what
--         was consumed is returned);
--   the instant in microseconds, or "" for Redis TIME (taken once per call);
--   the number of items, then 8 fields per item: base key, algorithm
--         (0 fixed_window, 1 sliding_window, 2 sliding_log, 3 token_bucket),
--         window µs, limit, burst, hits, flags (1 refund, 2 shadow), quota
--         group (0 = none).
-- Returns one reply per request: {admitted, now, then per item admitted,
-- remaining, reset µs, retry µs, then (mode R, admitted) the undo log: a
-- list of {op, key, args...}, and the statuses with nothing consumed: per
-- item remaining and reset µs, which the request shows if it is denied on
-- another node and released}.
--
-- The script runs on every request, so it is written for the Lua
-- interpreter: items and counters live in arrays indexed by position (no
-- table per item) that every request of the call reuses, and small helpers
-- are inlined.

local FW, SW, SL, TB = 0, 1, 2, 3
local floor, min, max, tonumber, tostring, unpack = math.floor, math.min, math.max, tonumber, tostring, unpack
local call = redis.call
local argv = ARGV

local now, redis_now -- the current request's instant; Redis TIME once taken

-- exact floor(a / b) for non-negative integers below 2^53
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function fmt(x)
  return string.format('%.0f', x)
end

-- freed announces that hits of the counter base were given back (a refund),
-- on the channel <prefix>freed: other rls processes drop their cached
-- denials of that counter (the prefix is what precedes the hash tag). pcall:
-- an account without the channel's permission must not fail the script
-- halfway through its writes (their caches then stay off, see freed.go).
local function freed(base)
  redis.pcall('PUBLISH', string.match(base, '^[^{]*') .. 'freed', base)
end

-- ttl_ms returns the milliseconds from now to the instant us (at least 1).
-- Expiries are relative (PX, PEXPIRE) rather than absolute: the instant may
-- come from the test clock, which is not Redis's.
local function ttl_ms(us)
  return fmt(max(1, idiv(us - now + 999, 1000)))
end

-- Items (index k): ctr = its counter's index; ok, retry = pass-1 verdict.
local n
local i_ctr, i_hits, i_refund, i_shadow, i_group, i_ok, i_retry = {}, {}, {}, {}, {}, {}, {}
local i_lim, i_burst = {}, {} -- an override may share a counter with a configured limit
-- Counters (index c), each loaded once and normalized to now:
-- base, alg, w; key (window key), ws, exists, count, prev
-- (windows); tat (bucket); card, add, pop (log); the *0 arrays keep the
-- loaded values for undoing pass 1 and for the writes.
local c_base, c_alg, c_w = {}, {}, {}
local c_key, c_pkey, c_ws, c_count, c_prev, c_count0 = {}, {}, {}, {}, {}, {}
local c_tat, c_tat0, c_card, c_add, c_pop = {}, {}, {}, {}, {}
local by_base, nc

local function interval(c, limit)
  return idiv(c_w[c] + limit - 1, limit)
end

-- Window keys end with the window's start in seconds; every request of a
-- call shares the instant, so each suffix is formatted once.
local suffixes = {}
local function suffix(ws)
  local sfx = suffixes[ws]
  if not sfx then
    sfx = tostring(ws / 1000000)
    suffixes[ws] = sfx
  end
  return sfx
end

-- String keys (window counts, bucket TATs) are read once per call: kv[key]
-- is the value that the requests decided so far left (false: absent), so a
-- key that several requests of a call share is read once.
local kv = {}

-- The keys a request needs that the call has not read yet are gathered
-- (mk[1..nk]) and read at once.
local mk, nk = {}, 0

local function locate(c)
  local alg, base, w = c_alg[c], c_base[c], c_w[c]
  if alg == FW or alg == SW then
    local ws = idiv(now, w) * w
    local key = base .. ':' .. suffix(ws)
    c_ws[c], c_key[c] = ws, key
    if kv[key] == nil then
      nk = nk + 1
      mk[nk] = key
    end
    if alg == SW then
      local prev = base .. ':' .. suffix(ws - w)
      c_pkey[c] = prev
      if kv[prev] == nil then
        nk = nk + 1
        mk[nk] = prev
      end
    end
  elseif alg == TB then
    c_key[c] = base
    if kv[base] == nil then
      nk = nk + 1
      mk[nk] = base
    end
  else
    call('ZREMRANGEBYSCORE', base, '-inf', fmt(now - w))
    c_card[c], c_add[c], c_pop[c] = call('ZCARD', base), 0, 0
  end
end

local function load(c)
  local alg = c_alg[c]
  if alg == FW or alg == SW then
    local count = tonumber(kv[c_key[c]] or 0)
    c_count[c], c_count0[c] = count, count
    if alg == SW then
      c_prev[c] = tonumber(kv[c_pkey[c]] or 0)
    else
      c_prev[c] = 0
    end
  elseif alg == TB then
    local tat = tonumber(kv[c_key[c]] or 0)
    if tat < now then
      tat = now
    end
    c_tat[c], c_tat0[c] = tat, tat
  end
end

local function restore(c)
  c_count[c], c_tat[c], c_add[c], c_pop[c] = c_count0[c], c_tat0[c], 0, 0
end

-- k-th oldest entry of a log: existing entries first (the newest pop of them
-- removed), then the pending ones at now
local function kth(c, k)
  if k < c_card[c] - c_pop[c] then
    return tonumber(call('ZRANGE', c_base[c], k, k, 'WITHSCORES')[2])
  end
  return now
end

local function sw_estimate(c)
  local w = c_w[c]
  local weight = (w - (now - c_ws[c])) / w
  local est = c_prev[c] * weight
  return est + c_count[c]
end

local function admits(c, hits, limit, burst)
  local alg = c_alg[c]
  if alg ~= TB and hits > limit then
    return false
  end
  if alg == FW then
    return c_count[c] + hits <= limit
  elseif alg == SW then
    return sw_estimate(c) + hits <= limit
  elseif alg == SL then
    return c_card[c] - c_pop[c] + c_add[c] + hits <= limit
  end
  if limit == 0 then
    return hits == 0
  end
  if hits > burst then
    return false
  end
  local i = interval(c, limit)
  return c_tat[c] + hits * i - now <= burst * i
end

local function consume(c, hits, limit)
  if hits == 0 then
    return
  end
  local alg = c_alg[c]
  if alg == FW or alg == SW then
    c_count[c] = c_count[c] + hits
  elseif alg == SL then
    c_add[c] = c_add[c] + hits
  elseif limit > 0 then
    c_tat[c] = c_tat[c] + hits * interval(c, limit)
  end
end

local function give_back(c, hits, limit)
  local alg = c_alg[c]
  if alg == FW or alg == SW then
    c_count[c] = c_count[c] - min(c_count[c], hits)
  elseif alg == SL then
    local a = min(c_add[c], hits)
    c_add[c] = c_add[c] - a
    c_pop[c] = c_pop[c] + min(c_card[c] - c_pop[c], hits - a)
  elseif limit > 0 then
    local i = interval(c, limit)
    local d = c_tat[c] - now
    if hits >= idiv(d + i - 1, i) then
      c_tat[c] = now
    else
      c_tat[c] = c_tat[c] - hits * i
    end
  end
end

local function remaining(c, limit, burst)
  local alg = c_alg[c]
  if alg == FW then
    return limit - min(limit, c_count[c])
  elseif alg == SW then
    local r = limit - sw_estimate(c)
    if r <= 0 then
      return 0
    end
    return floor(r)
  elseif alg == SL then
    return limit - min(limit, c_card[c] - c_pop[c] + c_add[c])
  end
  if limit == 0 then
    return 0
  end
  local i = interval(c, limit)
  local tau = burst * i
  local d = c_tat[c] - now
  if d >= tau then
    return 0
  end
  return idiv(tau - d, i)
end

local function reset_at(c)
  local alg = c_alg[c]
  if alg == FW or alg == SW then
    return c_ws[c] + c_w[c]
  elseif alg == SL then
    if c_card[c] - c_pop[c] + c_add[c] == 0 then
      return now
    end
    return kth(c, 0) + c_w[c]
  end
  return c_tat[c]
end

local function retry_at(c, hits, limit, burst)
  local alg, w = c_alg[c], c_w[c]
  if alg == FW then
    return c_ws[c] + w
  elseif alg == SW then
    local ws, count = c_ws[c], c_count[c]
    local ending = ws + w
    if hits > limit then
      return ending
    end
    if count + hits <= limit then
      local a = limit - count - hits
      local e = w - a * w / c_prev[c]
      return max(now + 1, min(ending, ws + floor(e) - 1))
    end
    local a = limit - hits
    local e = w - a * w / count
    return max(ending, min(ending + w, ending + floor(e) - 1))
  elseif alg == SL then
    local len = c_card[c] - c_pop[c] + c_add[c]
    if hits > limit or len + hits <= limit then
      return now + w
    end
    return kth(c, len + hits - limit - 1) + w
  end
  if limit == 0 or hits > burst then
    return now + w
  end
  local i = interval(c, limit)
  return c_tat[c] + hits * i - burst * i
end

-- decide judges the request whose arguments start at argv[a] and returns
-- its reply and where the next request's arguments start.
local function decide(a)
  local mode = argv[a]
  if argv[a + 1] ~= '' then
    now = tonumber(argv[a + 1])
  else
    if not redis_now then
      local t = call('TIME')
      redis_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = redis_now
  end
  n, nc, nk, by_base = tonumber(argv[a + 2]), 0, 0, {}

  -- the counters, each loaded once: all string keys in one MGET when the
  -- store says they share a slot or there are no slots (mode "M")

  for k = 1, n do
    local base = argv[a + 3 + (k - 1) * 8]
    local c = by_base[base]
    if not c then
      nc = nc + 1
      c = nc
      by_base[base] = c
      local f = a + 2 + (k - 1) * 8
      c_base[c], c_alg[c], c_w[c] = base, tonumber(argv[f + 2]), tonumber(argv[f + 3])
      locate(c)
    end
    i_ctr[k] = c
  end
  if nk > 0 and mode == 'M' then
    local vals = call('MGET', unpack(mk, 1, nk))
    for j = 1, nk do
      kv[mk[j]] = vals[j]
    end
  else
    for j = 1, nk do
      kv[mk[j]] = call('GET', mk[j])
    end
  end
  for c = 1, nc do
    load(c)
  end

  -- pass 1: judge the items in order, consuming tentatively

  for k = 1, n do
    local f = a + 2 + (k - 1) * 8
    local c = i_ctr[k]
    local limit, burst = tonumber(argv[f + 4]), tonumber(argv[f + 5])
    local hits, flags = tonumber(argv[f + 6]), tonumber(argv[f + 7])
    local refund = flags % 2 == 1
    i_hits[k], i_refund[k], i_shadow[k], i_group[k] = hits, refund, flags >= 2, tonumber(argv[f + 8])
    i_lim[k], i_burst[k], i_retry[k] = limit, burst, 0
    if refund then
      i_ok[k] = true
      give_back(c, hits, limit)
    elseif admits(c, hits, limit, burst) then
      i_ok[k] = true
      consume(c, hits, limit)
    else
      i_ok[k] = false
      i_retry[k] = retry_at(c, hits, limit, burst) - now
    end
  end

  -- the all-or-nothing rule (engine.decide)

  local admitted, quota = true, false
  for k = 1, n do
    if i_group[k] ~= 0 then
      quota = true
    elseif not i_shadow[k] and not i_ok[k] then
      admitted = false
    end
  end
  local over, quota_fail = {}, false
  if quota then
    for k = 1, n do
      if i_group[k] ~= 0 and not i_shadow[k] and not i_ok[k] then
        over[i_group[k]] = true
      end
    end
    if mode ~= 'R' then
      local any_pass = false
      for k = 1, n do
        if i_group[k] ~= 0 and not over[i_group[k]] then
          any_pass = true
        end
      end
      if not any_pass then
        admitted = false
      end
    end
    if admitted then
      for k = 1, n do
        if i_group[k] ~= 0 and over[i_group[k]] and i_ok[k] then
          quota_fail = true
        end
      end
    end
  end
  if not admitted or quota_fail then
    for c = 1, nc do
      restore(c)
    end
  end
  if admitted and quota_fail then
    for k = 1, n do
      if i_ok[k] and not over[i_group[k]] then
        if i_refund[k] then
          give_back(i_ctr[k], i_hits[k], i_lim[k])
        else
          consume(i_ctr[k], i_hits[k], i_lim[k])
        end
      end
    end
  end

  -- results, from the final state of each counter

  local out = { admitted and 1 or 0, now }
  for k = 1, n do
    local c = i_ctr[k]
    local m = #out
    out[m + 1] = i_ok[k] and 1 or 0
    out[m + 2] = remaining(c, i_lim[k], i_burst[k])
    out[m + 3] = max(0, reset_at(c) - now)
    out[m + 4] = max(0, i_retry[k])
  end

  -- mode R, admitted: the statuses as a denied request reads them on one
  -- node (remaining and reset from the state before this request), for
  -- when another node denies it. Taken before the writes: a sliding log's
  -- oldest entry is read from its sorted set.

  local reserve = mode == 'R'
  local view
  if reserve and admitted then
    local sc, st, sa, sp = {}, {}, {}, {}
    for c = 1, nc do
      sc[c], st[c], sa[c], sp[c] = c_count[c], c_tat[c], c_add[c], c_pop[c]
      restore(c)
    end
    view = {}
    for k = 1, n do
      local c = i_ctr[k]
      view[2 * k - 1] = remaining(c, i_lim[k], i_burst[k])
      view[2 * k] = max(0, reset_at(c) - now)
    end
    for c = 1, nc do
      c_count[c], c_tat[c], c_add[c], c_pop[c] = sc[c], st[c], sa[c], sp[c]
    end
  end

  -- writes: each counter that changed (string keys also in the call's cache)

  local undo = {}
  for c = 1, nc do
    local alg, base = c_alg[c], c_base[c]
    if alg == FW or alg == SW then
      local delta = c_count[c] - c_count0[c]
      if delta < 0 then
        freed(base)
      end
      if delta ~= 0 then
        local key = c_key[c]
        if kv[key] then
          call('INCRBY', key, delta)
        else -- created now: it expires at the window's end
          local ttl = c_ws[c] + c_w[c]
          if alg == SW then
            ttl = ttl + c_w[c]
          end
          call('SET', key, c_count[c], 'PX', ttl_ms(ttl))
        end
        kv[key] = c_count[c]
        if reserve then
          undo[#undo + 1] = { 'I', c_key[c], -delta }
        end
      end
    elseif alg == TB then
      local tat = c_tat[c]
      if tat < c_tat0[c] then
        freed(base)
      end
      if tat ~= c_tat0[c] then
        if tat > now then
          call('SET', base, fmt(tat), 'PX', ttl_ms(tat))
          kv[base] = tat
        else
          call('DEL', base)
          kv[base] = false
        end
        if reserve then
          undo[#undo + 1] = { 'T', base, fmt(c_tat0[c] - tat) }
        end
      end
    elseif c_pop[c] > 0 or c_add[c] > 0 then
      if c_pop[c] > c_add[c] then
        freed(base)
      end
      local w = c_w[c]
      if c_pop[c] > 0 then
        local popped = call('ZPOPMAX', base, c_pop[c])
        local op = { 'A', base, fmt(w) }
        for j = 1, #popped, 2 do
          op[#op + 1] = popped[j + 1]
          op[#op + 1] = popped[j]
        end
        undo[#undo + 1] = op
      end
      if c_add[c] > 0 then
        local op = { 'Z', base }
        local seq = c_card[c] - c_pop[c]
        local stamp = fmt(now)
        for _ = 1, c_add[c] do
          local member
          repeat
            seq = seq + 1
            member = stamp .. '-' .. seq
          until call('ZADD', base, 'NX', stamp, member) == 1
          op[#op + 1] = member
        end
        undo[#undo + 1] = op
      end
      local newest = call('ZRANGE', base, -1, -1, 'WITHSCORES')
      if #newest > 0 then
        call('PEXPIRE', base, ttl_ms(tonumber(newest[2]) + w))
      end
    end
  end
  if reserve and admitted then
    out[#out + 1] = undo
    out[#out + 1] = view
  end
  return out, a + 3 + 8 * n
end

local replies, a = {}, 2
for r = 1, tonumber(argv[1]) do
  replies[r], a = decide(a)
end
return replies
