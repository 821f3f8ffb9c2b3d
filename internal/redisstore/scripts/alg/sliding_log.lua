-- sliding_log (engine/sliding_log.go): exact, a log of the hits of each
-- consumption (instant, hits) counted over the last window. Its state is
-- a sorted set of its own (the counter's key, engine.CounterKey) of
-- entries scored by their instant, members "<instant>-<seq>/<hits>", and
-- the member LOG_TOTAL whose score is minus one minus the hits of the
-- entries (below every instant, so range reads by score never meet it;
-- kept in the same key, so the two cannot part); it expires one window
-- after its newest entry. alg/concurrency.lua counts with it too.

local ALG_SLIDING_LOG = 2

local log = {}
algorithms[ALG_SLIDING_LOG] = log

do
  -- A log (index c): its key (base), its total hits (count; count0 as
  -- located), its entries when located (card) and whether it had its
  -- LOG_TOTAL member, and whether locate removed expired entries (stale:
  -- the total must be written even if nothing else is). What a request
  -- changes waits for the writes: pop, the newest stored entries removed;
  -- trim, hits taken off the newest stored entry left; pend, the entries
  -- added ({at, hits}, at the counter's instant, or a merged entry's).
  local l_base, l_count, l_count0, l_card, l_has_total, l_stale = {}, {}, {}, {}, {}, {}
  local l_pop, l_trim, l_pend = {}, {}, {}

  local function log_hits(member)
    return tonumber(match(member, '/(%d+)$') or 1) -- "<instant>-<seq>": one hit (before entries carried hits)
  end

  local function log_member(at, seq, hits)
    return fmt(at) .. '-' .. seq .. '/' .. fmt(hits)
  end

  -- the stored entry k (from 0) counted from the oldest: member, instant, hits
  local function log_stored(c, k)
    local off = l_has_total[c] and 1 or 0 -- LOG_TOTAL comes first
    local e = call('ZRANGE', l_base[c], k + off, k + off, 'WITHSCORES')
    return e[1], tonumber(e[2]), log_hits(e[1])
  end

  function log.locate(c)
    local base, w = counter_key(c_key[c], c_id[c]), c_w[c]
    l_base[c] = base
    local newest = call('ZRANGE', base, -1, -1, 'WITHSCORES')
    local t = now
    if newest[1] and newest[1] ~= LOG_TOTAL then
      t = max(now, tonumber(newest[2])) -- never before the newest entry
    end
    local expired, gone = call('ZRANGEBYSCORE', base, 0, fmt(t - w)), 0
    for j = 1, #expired do
      gone = gone + log_hits(expired[j])
    end
    if #expired > 0 then
      call('ZREMRANGEBYSCORE', base, 0, fmt(t - w))
    end
    local total = call('ZSCORE', base, LOG_TOTAL)
    local card = call('ZCARD', base)
    l_has_total[c] = total ~= false and total ~= nil
    if l_has_total[c] then
      total, card = -tonumber(total) - 1, card - 1
    else
      total = 0 -- a log written before entries carried hits: count them
      local all = card > 0 and call('ZRANGE', base, 0, -1) or {}
      for j = 1, #all do
        total = total + log_hits(all[j])
      end
    end
    if card == 0 then
      total = 0
    end
    l_card[c], c_t[c] = card, t
    l_count[c], l_count0[c] = max(0, total - gone), max(0, total - gone)
    l_stale[c] = #expired > 0 -- entries removed: the total must be written even if nothing else is
  end

  function log.load(c)
    l_pop[c], l_trim[c], l_pend[c] = 0, 0, {}
  end

  local function log_len(c)
    return l_card[c] - l_pop[c] + #l_pend[c]
  end

  function log.admits(c, hits, limit)
    return hits <= limit and l_count[c] + hits <= limit
  end

  -- log_consume is the consume of a log; keep_at says whether the hits that
  -- join its newest entry keep that entry's instant (log.consume_keeping,
  -- alg/concurrency.lua) or give it theirs (sliding_log).
  local function log_consume(c, hits, limit, keep_at)
    if hits == 0 then
      return
    end
    l_count[c] = l_count[c] + hits
    local pend, n = l_pend[c], log_len(c)
    if n > 0 and n >= max(limit, 1) then
      -- As many entries as the limit: the newest takes the hits.
      if #pend > 0 then
        local at = keep_at and pend[#pend][1] or c_t[c]
        pend[#pend] = { at, pend[#pend][2] + hits }
      else
        local _, at, h = log_stored(c, l_card[c] - l_pop[c] - 1)
        pend[1] = { keep_at and at or c_t[c], h - l_trim[c] + hits }
        l_pop[c], l_trim[c] = l_pop[c] + 1, 0
      end
      return
    end
    pend[#pend + 1] = { c_t[c], hits }
  end

  function log.consume(c, hits, limit)
    log_consume(c, hits, limit, false)
  end

  function log.consume_keeping(c, hits, limit)
    log_consume(c, hits, limit, true)
  end

  function log.give_back(c, hits)
    local pend = l_pend[c]
    while hits > 0 and log_len(c) > 0 do
      local h
      if #pend > 0 then
        h = pend[#pend][2]
        if h > hits then
          pend[#pend] = { pend[#pend][1], h - hits }
          l_count[c] = l_count[c] - hits
          return
        end
        pend[#pend] = nil
      else
        local _
        _, _, h = log_stored(c, l_card[c] - l_pop[c] - 1)
        h = h - l_trim[c]
        if h > hits then
          l_trim[c] = l_trim[c] + hits
          l_count[c] = l_count[c] - hits
          return
        end
        l_pop[c], l_trim[c] = l_pop[c] + 1, 0
      end
      hits = hits - h
      l_count[c] = l_count[c] - min(l_count[c], h)
    end
  end

  -- A log holds a reserve's hits in its count beside its entries (engine's
  -- slidingLog.hold), not as an entry: l_count is the entries' hits and
  -- the hits held (carry), and the LOG_TOTAL written is the entries' only.
  function log.hold(c, hits)
    l_count[c] = l_count[c] + hits
  end

  function log.unhold(c, hits)
    l_count[c] = l_count[c] - min(l_count[c], hits)
  end

  function log.carry(c, held)
    l_count[c], l_count0[c] = l_count[c] + held, l_count0[c] + held
  end

  function log.rebase(c)
    l_count0[c] = l_count[c]
  end

  function log.restore(c)
    l_count[c], l_pop[c], l_trim[c], l_pend[c] = l_count0[c], 0, 0, {}
  end

  function log.remaining(c, limit)
    return limit - min(limit, l_count[c])
  end

  -- the k-th entry (from 0) from the oldest: instant and hits
  local function log_entry(c, k)
    local stored = l_card[c] - l_pop[c]
    if k < stored then
      local _, at, h = log_stored(c, k)
      if k == stored - 1 then
        h = h - l_trim[c]
      end
      return at, h
    end
    local e = l_pend[c][k - stored + 1]
    return e[1], e[2]
  end

  function log.reset_at(c)
    if log_len(c) == 0 then
      return c_t[c]
    end
    local at = log_entry(c, 0)
    return at + c_w[c]
  end

  function log.retry_at(c, hits, limit)
    local w = c_w[c]
    if hits > limit then
      return never
    end
    if l_count[c] + hits <= limit then
      return c_t[c] + w
    end
    local excess = l_count[c] + hits - limit
    for k = 0, log_len(c) - 1 do
      local at, h = log_entry(c, k)
      if h >= excess then
        return at + w
      end
      excess = excess - h
    end
    return c_t[c] + w
  end

  function log.write(c, undo)
    local base, w, pop, trim, pend = l_base[c], c_w[c], l_pop[c], l_trim[c], l_pend[c]
    if pop == 0 and trim == 0 and #pend == 0 and not l_stale[c] then
      return
    end
    if l_count[c] < l_count0[c] then
      freed(base)
    end
    local stored = l_card[c] - pop
    local newest
    -- The undo log removes the entries added before it puts back those
    -- removed: a new entry may reuse a removed one's member name.
    local restores = {}
    if pop > 0 then
      local popped = call('ZPOPMAX', base, pop)
      if undo then
        local op = { UNDO_ZADD, base, fmt(w), #popped }
        for j = 1, #popped, 2 do
          op[#op + 1] = popped[j + 1]
          op[#op + 1] = popped[j]
        end
        restores[#restores + 1] = op
      end
    end
    local seq = stored
    local added = undo and { UNDO_ZREM, base, 0 }
    local function add(at, hits)
      local member
      repeat
        seq = seq + 1
        member = log_member(at, seq, hits)
      until call('ZADD', base, 'NX', fmt(at), member) == 1
      if added then
        added[#added + 1] = member
        added[3] = added[3] + 1
      end
    end
    if trim > 0 then -- the newest stored entry left loses trim hits: replaced
      local m, at, h = log_stored(c, stored - 1)
      call('ZREM', base, m)
      if undo then
        restores[#restores + 1] = { UNDO_ZADD, base, fmt(w), 2, fmt(at), m }
      end
      add(at, h - trim)
    end
    for j = 1, #pend do
      add(pend[j][1], pend[j][2])
    end
    if added and added[3] > 0 then
      undo[#undo + 1] = added
    end
    for j = 1, #restores do
      undo[#undo + 1] = restores[j]
    end
    if stored + #pend == 0 then
      call('DEL', base)
      return
    end
    if #pend > 0 then
      newest = pend[#pend][1]
    else
      local _
      _, newest = log_stored(c, stored - 1)
    end
    local entries = l_count[c]
    if c_hold[c] then
      entries = entries - min(entries, c_held[c])
    end
    call('ZADD', base, fmt(-entries - 1), LOG_TOTAL)
    call('PEXPIRE', base, ttl_ms(newest + w, now))
  end

  -- The undo of a log's writes (UNDO_ZREM and UNDO_ZADD at args[i]): entries
  -- it added removed, entries it removed put back if still in the window.
  -- Each returns where the next operation starts; log_undone holds the logs
  -- changed, whose totals finish_undo counts again.
  local log_undone, log_undone_set = {}, {}

  local function log_undone_add(key)
    if not log_undone_set[key] then
      log_undone[#log_undone + 1], log_undone_set[key] = key, true
    end
  end

  -- UNDO_ZREM key count members...: remove log entries
  local function undo_log_added(args, i)
    local key, count = args[i + 1], tonumber(args[i + 2])
    for j = 1, count do
      call('ZREM', key, args[i + 2 + j])
    end
    log_undone_add(key)
    return i + 3 + count
  end

  -- UNDO_ZADD key window count (score member)...: put back log entries
  local function undo_log_removed(args, i, now)
    local key, w, count = args[i + 1], tonumber(args[i + 2]), tonumber(args[i + 3])
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
    log_undone_add(key)
    return i + 4 + count
  end

  log.undo = { [UNDO_ZREM] = undo_log_added, [UNDO_ZADD] = undo_log_removed }

  -- finish_undo counts again the totals of the logs an undo changed.
  function log.finish_undo()
    for l = 1, #log_undone do
      local key = log_undone[l]
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
    log_undone, log_undone_set = {}, {}
  end
end
