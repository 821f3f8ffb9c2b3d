-- decide.lua: judges every limit of one request at one instant and consumes
-- all of them or none. It is engine.Evaluate (internal/engine/evaluate.go)
-- over the algorithms of internal/engine (one file per algorithm there, one
-- section per algorithm here), phase for phase and with the same
-- arithmetic: integers stay below 2^53 (exact in Lua numbers), and the
-- sliding window's float estimate uses the same IEEE-754 operations in the
-- same order. A differential test holds the two to identical answers.
--
-- One call (FCALL of decide_entry) decides several requests, one after the
-- other, each whole: the store sends the requests that arrive together in
-- one call, so that its fixed cost (the call, TIME, its tables) is paid once
-- per batch rather than once per request.
--
-- keys[1]: a key of the node (cluster routing only; every key is in args).
-- args and the reply: see the wire contract in prelude.lua.
--
-- The script runs on every request, so it is written for the Lua
-- interpreter: items and counters live in arrays indexed by position (no
-- table per item) that every request of the call reuses.

local argv -- the call's arguments
local now -- the current request's instant (the decision's, engine.Evaluate's now)

-- Items (index k): ctr = its counter's index; ok, retry = the judging
-- pass's verdict. An override may share a counter with a configured limit,
-- so limit and burst are the item's, not the counter's.
local n
local i_ctr, i_hits, i_refund, i_shadow, i_group, i_ok, i_retry, i_cd, i_denied = {}, {}, {}, {}, {}, {}, {}, {}, {}
-- i_before[k]: a denied count-denied item's remaining just before its
-- charge (set by charge_denied, read by statuses)
local i_before = {}
-- i_pen[k]: the item's penalty (its rule's: reset and steps) or false;
-- i_blocked[k]: the judging pass found its counter blocked
local i_pen, i_blocked = {}, {}

-- never is what retry_at returns for hits that no instant admits (engine's
-- never, Result.Never): more than the limit, or the bucket, holds.
local never = {}
local i_lim, i_burst = {}, {}

-- Counters (index c), each loaded once per request and normalized: key
-- (its hash: the descriptor's key), id (its field: the rule's ID), base
-- (a sliding log's key), alg, w, impl (its section below), t (the
-- counter's instant: now, or later when its state has seen later instants,
-- see engine/algorithm.go); then the state its section uses: ws, count,
-- prev (windows), tat (bucket), count and the arrays of its section (log).
-- The *0 arrays keep the loaded values, for undoing the judging pass and
-- for the writes.
local c_key, c_id, c_base, c_alg, c_w, c_warg, c_impl, c_t = {}, {}, {}, {}, {}, {}, {}, {}
local c_ws, c_count, c_count0, c_prev = {}, {}, {}, {}
local c_s0, c_n0, c_p0 = {}, {}, {} -- window counters: the stored state (start false: none)
local c_tat, c_tat0 = {}, {}
-- A penalized counter (c_pen: the penalty of its first penalized item, else
-- false): its strikes and block end, and the field's value as loaded.
local c_pen, c_strikes, c_until, c_pv0 = {}, {}, {}, {}
local penal -- the request has penalized items
local nc
local by_counter -- a request of many items: counter index by key and id (see parse)
local plain -- the request's items have no flags and no group (parse)
-- hashed: every counter of the request is kept in its descriptor's hash
-- and its status follows from its field alone (its section's in_hash):
-- an admission of plain items then answers VERDICT_ADMITTED_STATES (parse)
local hashed

-- Hashes are read once per call and written once per call, at its end:
-- hv[key] is the fields that the requests decided so far left (a field
-- absent: no state), hx[key] the instant at which the hash expires (0:
-- none). A request's hashes that the call has not read yet are gathered in
-- mk[1..nk] and read together. A field a request changes is staged
-- (stage): its hash and field appended to wk, wf (1..nw), and flush
-- writes each changed hash with one HSET (and PEXPIRE when its expiry
-- grew, grew[key]): every counter of a descriptor in one command.
local hv, hx, grew
local mk, nk = {}, 0
local wk, wf, nw = {}, {}, 0

local function need(key)
  if hv[key] == nil then
    nk = nk + 1
    mk[nk] = key
    hv[key] = false -- gathered
  end
end

-- stage sets field id of hash key to value, a state that expires at
-- expires, or deletes the field when value is false (a state equivalent to
-- none, which a touch forgets, as memstore forgets it: a stale state would
-- read as its old self again if the clock stepped back).
local function stage(key, id, value, expires)
  hv[key][id] = value
  nw = nw + 1
  wk[nw], wf[nw] = key, id
  if value and expires > hx[key] then
    hx[key] = expires
    grew[key] = true
  end
end

-- flush writes what the call staged: per hash, one HSET of the fields set
-- and one HDEL of those deleted, at the hash's first staged field (the
-- fields a later request staged in it are gathered from there). Expiries
-- are relative to the last request's instant: the hash's is an instant of
-- that clock.
local fv, dv = {}, {}
local function flush()
  for j = 1, nw do
    local key = wk[j]
    if key then -- not written with an earlier entry's hash
      local t = hv[key]
      local m, ndel = 0, 0
      for i = j, nw do
        if wk[i] == key then
          wk[i] = false
          local id = wf[i]
          local v = t[id]
          if v then
            fv[m + 1], fv[m + 2] = id, v
            m = m + 2
          else
            ndel = ndel + 1
            dv[ndel] = id
          end
        end
      end
      local g = grew[key]
      if g then
        fv[m + 1], fv[m + 2] = HASH_EXPIRY, spack(STATE_NUMBER, hx[key])
        m = m + 2
      end
      if m > 0 then
        call('HSET', key, unpack(fv, 1, m))
      end
      if ndel > 0 then
        call('HDEL', key, unpack(dv, 1, ndel))
      end
      if g then
        call('PEXPIRE', key, ttl_ms(hx[key], now))
      end
    end
  end
end

-- window_load loads a window counter's state (see window_read) into the
-- counter's arrays, its window rolled to the one starting at ws (shift: a
-- count of the window just before weighs as the previous one, as in a
-- sliding window); with a state that has seen a later window, the counter
-- keeps it and its instant is that window's start.
local function window_load(c, ws, shift)
  local start, count, prev = window_read(hv[c_key[c]][c_id[c]])
  c_s0[c], c_n0[c], c_p0[c] = start or false, count, prev
  local t = now
  if not start then
    start, count, prev = ws, 0, 0
  elseif ws < start then
    t = start -- a later window was seen: no time passes before it
  elseif shift and ws - c_w[c] == start then
    start, count, prev = ws, 0, count
  elseif ws > start then
    start, count, prev = ws, 0, 0
  end
  c_ws[c], c_count[c], c_count0[c], c_prev[c], c_t[c] = start, count, count, prev, t
end

-- A window counter's write: its field staged when its state changed,
-- deleted once the state is equivalent to none (expires not after now:
-- memstore forgets such a counter too). undo logs the request's delta. w is
-- the length of the counter's window (default its rule's), and its
-- section's span the windows a count weighs for. It is the write of the
-- fixed and sliding sections.
local function write_window(c, undo, w)
  w = w or c_w[c]
  local span = c_impl[c].span
  local start, count, prev = c_ws[c], c_count[c], c_prev[c]
  local delta = count - c_count0[c]
  if delta < 0 then
    freed(counter_key(c_key[c], c_id[c]))
  end
  local expires = window_expiry(start, count, prev, w, span)
  if expires <= now then
    if c_s0[c] then
      stage(c_key[c], c_id[c], false, 0)
    end
  elseif start ~= c_s0[c] or count ~= c_n0[c] or prev ~= c_p0[c] then
    stage(c_key[c], c_id[c], window_value(start, count, prev, span == 2), expires)
  end
  if undo and delta ~= 0 then
    undo[#undo + 1] = { UNDO_WINDOW, c_key[c], c_id[c], start, w, span, delta }
  end
end

-- undo_window gives back what a window counter's write logged (UNDO_WINDOW,
-- at args[i]: key id start window span delta): delta hits off the count
-- when the counter's window still starts at start, off its previous
-- window's when it starts a window later (never below 0); a window that is
-- over has nothing left to give back. It returns where the next operation
-- starts.
local function undo_window(args, i, now)
  local key, id = args[i + 1], args[i + 2]
  local start, w, span, delta = tonumber(args[i + 3]), tonumber(args[i + 4]), tonumber(args[i + 5]), tonumber(args[i + 6])
  local s, count, prev = window_read(call('HGET', key, id))
  if not s then
    s, count, prev = start, 0, 0 -- deleted by the request (a refund emptied it) or expired since
  end
  if s == start then
    count = max(0, count - delta)
  elseif s == start + w then
    prev = max(0, prev - delta)
  else
    return i + 7 -- that window is over: nothing is left to give back
  end
  local expires = window_expiry(s, count, prev, w, span)
  set_field(key, id, expires > now and window_value(s, count, prev, span == 2), expires, now)
  return i + 7
end

---------------------------------------------------------------------------
-- fixed_window (engine/fixed_window.go): the field holds the counter's
-- window start and count, which weigh until the window ends.

local fixed = {}

-- need_hash is the locate of a counter kept in its descriptor's hash
-- (parse calls need itself for those).
local function need_hash(c)
  need(c_key[c])
end

fixed.locate = need_hash

function fixed.load(c)
  window_load(c, idiv(now, c_w[c]) * c_w[c], false)
end

function fixed.admits(c, hits, limit)
  return hits <= limit and c_count[c] + hits <= limit
end

function fixed.consume(c, hits)
  c_count[c] = c_count[c] + hits
end

function fixed.give_back(c, hits)
  c_count[c] = c_count[c] - min(c_count[c], hits)
end

function fixed.remaining(c, limit)
  local count = c_count[c]
  if count >= limit then -- limit - min(limit, count), without a call
    return 0
  end
  return limit - count
end

function fixed.reset_at(c)
  return c_ws[c] + c_w[c]
end

function fixed.retry_at(c, hits, limit)
  if hits > limit then
    return never
  end
  return c_ws[c] + c_w[c]
end

fixed.span = 1
fixed.in_hash = true
fixed.write = write_window

fixed.undo = { [UNDO_WINDOW] = undo_window }

---------------------------------------------------------------------------
-- calendar window (engine/calendar_window.go): a fixed window on a time
-- zone's calendar. The store computes, around its own clock, the starts of
-- the previous, current and next windows and the next one's end, and sends
-- them as the item's window ("b1:b2:b3:b4"): Redis's clock falls in one of
-- them. The field is a fixed window's.

local calendar = {}
local c_bounds = {}

function calendar.locate(c)
  local b1, b2, b3, b4 = match(c_warg[c], '^(%d+):(%d+):(%d+):(%d+)$')
  c_bounds[c] = { tonumber(b1), tonumber(b2), tonumber(b3), tonumber(b4) }
  need_hash(c)
end

-- the start of the calendar window holding t, among the bounds sent
local function calendar_start(c, t)
  local b = c_bounds[c]
  for i = 3, 1, -1 do
    if t >= b[i] then
      return b[i]
    end
  end
  return b[1]
end

-- the end of the calendar window that starts at start
local function calendar_end(c, start)
  local b = c_bounds[c]
  for i = 1, 3 do
    if b[i] == start then
      return b[i + 1]
    end
  end
  return start + b[4] - b[3] -- a window not around the store's clock: about that long
end

function calendar.load(c)
  window_load(c, calendar_start(c, now), false)
end

calendar.admits = fixed.admits
calendar.consume = fixed.consume
calendar.give_back = fixed.give_back
calendar.remaining = fixed.remaining

function calendar.reset_at(c)
  return calendar_end(c, c_ws[c])
end

function calendar.retry_at(c, hits, limit)
  if hits > limit then
    return never
  end
  return calendar.reset_at(c)
end

calendar.span = 1

function calendar.write(c, undo)
  write_window(c, undo, calendar_end(c, c_ws[c]) - c_ws[c])
end

calendar.undo = fixed.undo

---------------------------------------------------------------------------
-- sliding_window (engine/sliding_window.go): the field holds the counter's
-- window start, count and the previous window's count, which weigh until
-- the previous window no longer does.

local sliding = {}

sliding.locate = fixed.locate

function sliding.load(c)
  window_load(c, idiv(now, c_w[c]) * c_w[c], true)
end

local function estimate(c)
  local w = c_w[c]
  local weight = (w - (c_t[c] - c_ws[c])) / w
  local est = c_prev[c] * weight
  return est + c_count[c]
end

function sliding.admits(c, hits, limit)
  return hits <= limit and estimate(c) + hits <= limit
end

sliding.consume = fixed.consume -- the current window's count
sliding.give_back = fixed.give_back

function sliding.remaining(c, limit)
  local r = limit - estimate(c)
  if r <= 0 then
    return 0
  end
  return floor(r)
end

function sliding.reset_at(c)
  return c_ws[c] + c_w[c]
end

function sliding.retry_at(c, hits, limit)
  local w, ws, count = c_w[c], c_ws[c], c_count[c]
  local ending = ws + w
  if hits > limit then
    return never
  end
  if count + hits <= limit then
    -- The previous window's weight has to decay.
    local a = limit - count - hits
    local e = w - a * w / c_prev[c]
    return max(c_t[c] + 1, min(ending, ws + floor(e) - 1))
  end
  -- Only in the next window, where this window becomes the previous one.
  local a = limit - hits
  local e = w - a * w / count
  return max(ending, min(ending + w, ending + floor(e) - 1))
end

sliding.span = 2
sliding.in_hash = true
sliding.write = write_window

sliding.undo = fixed.undo

---------------------------------------------------------------------------
-- sliding_log (engine/sliding_log.go): a sorted set of entries (instant,
-- hits) and their total (see LOG_TOTAL in the prelude); it expires one
-- window after its newest entry. What a request changes waits for the
-- writes: pop, the newest stored entries removed; trim, hits taken off the
-- newest stored entry left; pend, the entries added ({at, hits}, at the
-- counter's instant, or a merged entry's). count is the total.

local log = {}
local c_pop, c_trim, c_pend, c_card, c_stale, c_has_total = {}, {}, {}, {}, {}, {}

-- the stored entry k (from 0) counted from the oldest: member, instant, hits
local function log_stored(c, k)
  local off = c_has_total[c] and 1 or 0 -- LOG_TOTAL comes first
  local e = call('ZRANGE', c_base[c], k + off, k + off, 'WITHSCORES')
  return e[1], tonumber(e[2]), log_hits(e[1])
end

function log.locate(c)
  local base, w = counter_key(c_key[c], c_id[c]), c_w[c]
  c_base[c] = base
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
  c_has_total[c] = total ~= false and total ~= nil
  if c_has_total[c] then
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
  c_card[c], c_t[c] = card, t
  c_count[c], c_count0[c] = max(0, total - gone), max(0, total - gone)
  c_stale[c] = #expired > 0 -- entries removed: the total must be written even if nothing else is
end

function log.load(c)
  c_pop[c], c_trim[c], c_pend[c] = 0, 0, {}
end

local function log_len(c)
  return c_card[c] - c_pop[c] + #c_pend[c]
end

function log.admits(c, hits, limit)
  return hits <= limit and c_count[c] + hits <= limit
end

-- log_consume is the consume of a log; keep_at says whether the hits that
-- join its newest entry keep that entry's instant (concurrency) or give it
-- theirs (sliding_log).
local function log_consume(c, hits, limit, keep_at)
  if hits == 0 then
    return
  end
  c_count[c] = c_count[c] + hits
  local pend, n = c_pend[c], log_len(c)
  if n > 0 and n >= max(limit, 1) then
    -- As many entries as the limit: the newest takes the hits.
    if #pend > 0 then
      local at = keep_at and pend[#pend][1] or c_t[c]
      pend[#pend] = { at, pend[#pend][2] + hits }
    else
      local _, at, h = log_stored(c, c_card[c] - c_pop[c] - 1)
      pend[1] = { keep_at and at or c_t[c], h - c_trim[c] + hits }
      c_pop[c], c_trim[c] = c_pop[c] + 1, 0
    end
    return
  end
  pend[#pend + 1] = { c_t[c], hits }
end

function log.consume(c, hits, limit)
  log_consume(c, hits, limit, false)
end

function log.give_back(c, hits)
  local pend = c_pend[c]
  while hits > 0 and log_len(c) > 0 do
    local h
    if #pend > 0 then
      h = pend[#pend][2]
      if h > hits then
        pend[#pend] = { pend[#pend][1], h - hits }
        c_count[c] = c_count[c] - hits
        return
      end
      pend[#pend] = nil
    else
      local _
      _, _, h = log_stored(c, c_card[c] - c_pop[c] - 1)
      h = h - c_trim[c]
      if h > hits then
        c_trim[c] = c_trim[c] + hits
        c_count[c] = c_count[c] - hits
        return
      end
      c_pop[c], c_trim[c] = c_pop[c] + 1, 0
    end
    hits = hits - h
    c_count[c] = c_count[c] - min(c_count[c], h)
  end
end

function log.remaining(c, limit)
  return limit - min(limit, c_count[c])
end

-- the k-th entry (from 0) from the oldest: instant and hits
local function log_entry(c, k)
  local stored = c_card[c] - c_pop[c]
  if k < stored then
    local _, at, h = log_stored(c, k)
    if k == stored - 1 then
      h = h - c_trim[c]
    end
    return at, h
  end
  local e = c_pend[c][k - stored + 1]
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
  if c_count[c] + hits <= limit then
    return c_t[c] + w
  end
  local excess = c_count[c] + hits - limit
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
  local base, w, pop, trim, pend = c_base[c], c_w[c], c_pop[c], c_trim[c], c_pend[c]
  if pop == 0 and trim == 0 and #pend == 0 and not c_stale[c] then
    return
  end
  if c_count[c] < c_count0[c] then
    freed(base)
  end
  local stored = c_card[c] - pop
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
  call('ZADD', base, fmt(-c_count[c] - 1), LOG_TOTAL)
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

---------------------------------------------------------------------------
-- concurrency (engine/concurrency.go): requests in flight, a sliding log
-- whose window is the lease_ttl (sent as the item's window). It is the log's
-- section but for consume: hits beyond the limit's entries (charged when
-- denied) join the newest entry at that entry's instant, so that they never
-- make an acquisition outlive its lease.

local concurrency = {
  locate = log.locate,
  load = log.load,
  admits = log.admits,
  give_back = log.give_back,
  remaining = log.remaining,
  reset_at = log.reset_at,
  retry_at = log.retry_at,
  write = log.write,
  undo = log.undo,
  finish_undo = log.finish_undo,
}

function concurrency.consume(c, hits, limit)
  log_consume(c, hits, limit, true)
end

---------------------------------------------------------------------------
-- token_bucket (engine/token_bucket.go): the field holds the TAT in µs,
-- which weighs until it passes (an absent or past TAT is a full bucket). A
-- limit of 0 admits nothing and keeps no state.

local bucket = {}

local function interval(c, limit)
  return idiv(c_w[c] + limit - 1, limit)
end

bucket.locate = fixed.locate
bucket.in_hash = true

function bucket.load(c)
  local stored = number_read(hv[c_key[c]][c_id[c]])
  local tat = stored > now and stored or now
  c_tat[c], c_tat0[c], c_t[c], c_s0[c] = tat, tat, now, stored
end

function bucket.admits(c, hits, limit, burst)
  if limit == 0 then
    return hits == 0
  end
  if hits > burst then
    return false
  end
  local i = interval(c, limit)
  return c_tat[c] + hits * i - now <= burst * i
end

function bucket.consume(c, hits, limit)
  if limit > 0 then
    local tat = c_tat[c]
    c_tat[c] = min(tat + hits * interval(c, limit), max(tat, now + TB_MAX_AHEAD))
  end
end

function bucket.give_back(c, hits, limit)
  if limit == 0 then
    return
  end
  local i = interval(c, limit)
  if hits >= idiv(c_tat[c] - now + i - 1, i) then
    c_tat[c] = now
  else
    c_tat[c] = c_tat[c] - hits * i
  end
end

function bucket.remaining(c, limit, burst)
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

function bucket.reset_at(c)
  return c_tat[c]
end

function bucket.retry_at(c, hits, limit, burst)
  if limit == 0 or hits > burst then
    return never
  end
  local i = interval(c, limit)
  return c_tat[c] + hits * i - burst * i
end

function bucket.write(c, undo)
  local key, id, tat, tat0 = c_key[c], c_id[c], c_tat[c], c_tat0[c]
  if tat < tat0 then
    freed(counter_key(key, id))
  end
  if tat <= now then
    if c_s0[c] > 0 then
      stage(key, id, false, 0) -- a full bucket: no state
    end
  elseif tat ~= c_s0[c] then
    stage(key, id, spack(STATE_NUMBER, tat), tat) -- a TAT is its own expiry
  end
  if undo and tat ~= tat0 then
    undo[#undo + 1] = { UNDO_TAT, key, id, tat0 - tat }
  end
end

-- UNDO_TAT key id delta: TAT += delta µs. An absent or past TAT is a full
-- bucket, i.e. now (as load reads it): undoing a refund that filled the
-- bucket starts from there; a TAT not in the future is deleted.
local function undo_tat(args, i, now)
  local key, id = args[i + 1], args[i + 2]
  local tat = max(number_read(call('HGET', key, id)), now) + tonumber(args[i + 3])
  set_field(key, id, tat > now and spack(STATE_NUMBER, tat), tat, now)
  return i + 4
end

bucket.undo = { [UNDO_TAT] = undo_tat }

---------------------------------------------------------------------------
-- The algorithms by code; c_impl[c] is the section of counter c.

local algorithms = {
  [ALG_FIXED_WINDOW] = fixed,
  [ALG_SLIDING_WINDOW] = sliding,
  [ALG_SLIDING_LOG] = log,
  [ALG_TOKEN_BUCKET] = bucket,
  [ALG_CALENDAR_WINDOW] = calendar,
  [ALG_CONCURRENCY] = concurrency,
}

-- undo the judging pass on counter c (every section's state)
local function restore(c)
  c_count[c], c_tat[c], c_pop[c], c_trim[c], c_pend[c] = c_count0[c], c_tat0[c], 0, 0, {}
end

---------------------------------------------------------------------------
-- The phases of one request (engine.Evaluate).

-- rules caches the parsed rules by their argument (ITEM_RULE): a rule is
-- sent with every request, parsed at its first. At most max_rules are
-- kept (calendar windows make new ones as their bounds move).
local rules, nrules, max_rules = {}, 0, 4096

-- penalty_of returns a rule's penalty from its argument ('reset:step...',
-- engine.Rule.PenaltyArg): { reset = µs, steps = {µs...} }, false for ''.
local function penalty_of(arg)
  if arg == '' then
    return false
  end
  local p = { steps = {} }
  for x in string.gmatch(arg, '%d+') do
    if p.reset then
      p.steps[#p.steps + 1] = tonumber(x)
    else
      p.reset = tonumber(x)
    end
  end
  return p
end

-- rule_of returns the rule of an ITEM_RULE argument: code, w (µs; false
-- for a calendar window), warg (the window argument), limit, burst, id and
-- impl (its section); nil for an argument that names no known algorithm.
local function rule_of(arg)
  local r = rules[arg]
  if r then
    return r
  end
  local code, warg, limit, burst, pen, id = match(arg, RULE_PATTERN)
  local impl = code and algorithms[tonumber(code)]
  if not impl then
    return nil
  end
  if nrules >= max_rules then
    rules, nrules = {}, 0
  end
  r = { code = tonumber(code), w = tonumber(warg) or false, warg = warg, limit = tonumber(limit), burst = tonumber(burst), id = id, impl = impl,
        pen = penalty_of(pen) }
  rules[arg], nrules = r, nrules + 1
  return r
end

-- items_of returns the number of items of the request whose arguments
-- start at argv[a], and the fields each item takes.
local function items_of(a)
  local m = tonumber(argv[a + REQUEST_ITEMS - 1])
  if m < 0 then
    return -m, PLAIN_ITEM_FIELDS
  end
  return m, ITEM_FIELDS
end

-- parse reads the items of the request whose arguments start at argv[a]
-- and finds their counters, each once, with the hashes they need read.
local function parse(a)
  local width
  n, width = items_of(a)
  nc, nk, plain, penal, hashed = 0, 0, true, false, true
  by_counter = n > 16 and {} or nil
  for k = 1, n do
    local f = a + REQUEST_HEAD + (k - 1) * width - 1 -- item field j is argv[f + j]
    local key, arg = argv[f + ITEM_KEY], argv[f + ITEM_RULE]
    local r = rules[arg] or rule_of(arg) -- the cache's hit without a call
    if key == SAME_KEY then
      key = c_key[i_ctr[k - 1]]
    end
    local id = r.id
    -- Its counter among the request's so far: a request of a few items
    -- scans them, one of many keeps a map (by_counter) as it goes.
    local c
    if by_counter then
      local ids = by_counter[key]
      c = ids and ids[id]
    else
      for j = 1, nc do
        if c_id[j] == id and c_key[j] == key then
          c = j
          break
        end
      end
    end
    if not c then
      nc = nc + 1
      c = nc
      if by_counter then
        local ids = by_counter[key] or {}
        ids[id], by_counter[key] = c, ids
      end
      c_key[c], c_id[c], c_alg[c], c_w[c], c_warg[c], c_impl[c], c_pen[c] = key, id, r.code, r.w, r.warg, r.impl, false
      if not r.impl.in_hash then
        hashed = false
      end
      if r.impl.locate == need_hash then
        need(key) -- need_hash's work, one call less
      else
        r.impl.locate(c)
      end
    end
    i_ctr[k] = c
    i_lim[k], i_burst[k], i_pen[k], i_blocked[k] = r.limit, r.burst, r.pen, false
    if r.pen then
      penal = true
      if not c_pen[c] then
        c_pen[c] = r.pen
        need(key) -- the penalty's field, for a sliding log too
      end
    end
    local hits = width == PLAIN_ITEM_FIELDS and '1' or argv[f + ITEM_HITS]
    i_hits[k] = hits == '1' and 1 or tonumber(hits)
    local opts = width == PLAIN_ITEM_FIELDS and '0' or argv[f + ITEM_OPTS]
    if opts == '0' then
      i_refund[k], i_shadow[k], i_cd[k], i_denied[k], i_group[k] = false, false, false, false, 0
    else
      plain = false
      opts = tonumber(opts)
      local flags = opts % OPTS_GROUP
      i_group[k] = (opts - flags) / OPTS_GROUP
      i_refund[k], i_shadow[k] = flags % (2 * FLAG_REFUND) >= FLAG_REFUND, flags % (2 * FLAG_SHADOW) >= FLAG_SHADOW
      i_cd[k] = flags % (2 * FLAG_COUNT_DENIED) >= FLAG_COUNT_DENIED
      i_denied[k] = flags % (2 * FLAG_DENIED) >= FLAG_DENIED
    end
  end
end

---------------------------------------------------------------------------
-- Penalties (engine/penalty.go): a denial by a penalized counter's count is
-- a strike that blocks the counter for the next step of the ladder; a
-- block denies without judging, and after the penalty's reset has passed
-- since a block's end the ladder starts over.

-- penalty_load reads counter c's strikes and block end, the ladder started
-- over when the quiet time has passed at the counter's instant (forgive).
local function penalty_load(c)
  local v = hv[c_key[c]][c_id[c] .. PENALTY_SUFFIX] or false
  local strikes, untl = 0, 0
  if v then
    untl, strikes = sunpack(WINDOW_STATE, v)
  end
  if strikes > 0 and c_t[c] >= untl + c_pen[c].reset then
    strikes, untl = 0, 0
  end
  c_pv0[c], c_strikes[c], c_until[c] = v, strikes, untl
end

-- blocked reports whether item k's counter is blocked (engine's
-- Rule.blocked): the item is penalized and its counter's instant is before
-- the block's end.
local function blocked(k)
  local c = i_ctr[k]
  return i_pen[k] and c_t[c] < c_until[c]
end

-- strike records a strike on the counter of each penalized item that its
-- count denied, once per counter and request (engine's strike).
local function strike()
  for k = 1, n do
    if i_pen[k] and not i_ok[k] and not i_blocked[k] and not i_refund[k] and not blocked(k) then
      local c, steps = i_ctr[k], i_pen[k].steps
      local s = c_strikes[c] + 1
      c_strikes[c], c_until[c] = s, c_t[c] + steps[min(s, #steps)]
      if i_retry[k] ~= RETRY_NEVER then
        i_retry[k] = max(i_retry[k], c_until[c] - now)
      end
    end
  end
end

-- penalty_write stages counter c's penalty field when it changed (deleted
-- once the ladder started over).
local function penalty_write(c)
  local v = c_strikes[c] > 0 and spack(WINDOW_STATE, c_until[c], c_strikes[c])
  if v ~= c_pv0[c] then
    stage(c_key[c], c_id[c] .. PENALTY_SUFFIX, v, c_until[c] + c_pen[c].reset)
  end
end

-- load reads the hashes gathered by parse, each with one HGETALL, and
-- each counter's state.
local function load()
  for j = 1, nk do
    local key = mk[j]
    local all, t = call('HGETALL', key), {}
    for f = 1, #all, 2 do
      t[all[f]] = all[f + 1]
    end
    hv[key], hx[key] = t, number_read(t[HASH_EXPIRY])
  end
  for c = 1, nc do
    c_impl[c].load(c)
    if c_pen[c] then
      penalty_load(c)
    end
  end
end

-- take applies admitted item k to its counter (engine's take).
local function take(k)
  local c = i_ctr[k]
  if i_refund[k] then
    c_impl[c].give_back(c, i_hits[k], i_lim[k])
  else
    c_impl[c].consume(c, i_hits[k], i_lim[k])
  end
end

-- retry sets when denied item k could pass, as of the decision's instant,
-- or RETRY_NEVER (engine's retry).
local function retry(k)
  local c = i_ctr[k]
  local at = c_impl[c].retry_at(c, i_hits[k], i_lim[k], i_burst[k])
  if at == never then
    i_retry[k] = RETRY_NEVER
  else
    i_retry[k] = at - now
  end
end

-- judge is the judging pass: each item in order, consumed tentatively when
-- it admits (engine's judge). It returns whether every item admits.
local function judge()
  local all = true
  for k = 1, n do
    local c, hits, limit, burst = i_ctr[k], i_hits[k], i_lim[k], i_burst[k]
    local impl = c_impl[c]
    i_retry[k] = 0
    if not i_refund[k] and blocked(k) then
      -- engine's retryBlocked: the block's end, or later when the count
      -- would still deny then
      i_ok[k], i_blocked[k], all = false, true, false
      if impl.admits(c, hits, limit, burst) then
        i_retry[k] = c_until[c] - now
      else
        retry(k)
        if i_retry[k] ~= RETRY_NEVER then
          i_retry[k] = max(i_retry[k], c_until[c] - now)
        end
      end
    elseif i_refund[k] or impl.admits(c, hits, limit, burst) then
      i_ok[k] = true
      take(k)
    else
      i_ok[k], all = false, false
      retry(k)
    end
  end
  return all
end

-- rule is the all-or-nothing rule (engine.Admit): it returns whether the
-- request is admitted and, when admitted, the quota groups that are over
-- (nil for none). In MODE_RESERVE the store applies the rule's quota part
-- over the whole request: this node only says which of its groups are over,
-- and a negative group is one that the store found over elsewhere.
local function rule(mode)
  local admitted, quota, over = true, false, nil
  for k = 1, n do
    local g = i_group[k]
    if g ~= 0 then
      quota = true
      if g < 0 or not i_shadow[k] and not i_ok[k] then
        over = over or {}
        over[g] = true
      end
    elseif not i_shadow[k] and not i_ok[k] then
      admitted = false
    end
  end
  if not quota then
    return admitted, nil
  end
  local pass = mode == MODE_RESERVE
  for k = 1, n do
    local g = i_group[k]
    if g ~= 0 and not (over and over[g]) then
      pass = true
    end
  end
  if not admitted or not pass then
    return false, nil
  end
  return true, over
end

-- settle undoes the judging pass unless the request is admitted as judged,
-- and consumes again without the quota groups that are over.
local function settle(admitted, over)
  if admitted and not over then
    return
  end
  for c = 1, nc do
    restore(c)
  end
  if admitted then
    for k = 1, n do
      if i_ok[k] and not over[i_group[k]] then
        take(k)
      end
    end
  end
end

-- charge_denied takes the hits of the count-denied items that the
-- request's outcome left unconsumed, past their limits, and says when each
-- denied one could pass with its debt: at once when only the hits the
-- denied request took back denied it (engine's chargeDenied). A denied one
-- keeps what remained just before its charge (i_before).
local function charge_denied(admitted, over)
  for k = 1, n do
    if i_cd[k] and not i_refund[k] and not (admitted and i_ok[k] and not (over and over[i_group[k]])) then
      local c = i_ctr[k]
      local impl = c_impl[c]
      if i_blocked[k] then
        i_before[k] = 0 -- none remained in a block
      elseif not i_ok[k] then
        i_before[k] = impl.remaining(c, i_lim[k], i_burst[k])
      end
      impl.consume(c, i_hits[k], i_lim[k])
      if not i_ok[k] and not i_blocked[k] then -- a block's end does not move
        if impl.admits(c, i_hits[k], i_lim[k], i_burst[k]) then
          i_retry[k] = 0 -- denied only by hits the request took back
        else
          retry(k)
        end
      end
    end
  end
end

-- statuses appends per item: its verdict (REPLY_ITEM_*), remaining, reset
-- and retry µs (from the decision's instant, whatever the counter's own;
-- RETRY_NEVER when no wait admits the item's hits).
local function statuses(out)
  local m = #out
  for k = 1, n do
    local c = i_ctr[k]
    local impl = c_impl[c]
    if i_ok[k] then
      out[m + 1] = REPLY_ITEM_ADMITTED
    elseif i_blocked[k] then
      out[m + 1] = (i_cd[k] and not i_refund[k]) and REPLY_ITEM_BLOCKED_CHARGED or REPLY_ITEM_BLOCKED
    elseif i_cd[k] and not i_refund[k] then
      out[m + 1] = REPLY_ITEM_CHARGED - i_before[k]
    else
      out[m + 1] = REPLY_ITEM_DENIED
    end
    local reset, retry = impl.reset_at(c) - now, i_retry[k]
    if blocked(k) then -- none remain, and no reset before the block's end
      out[m + 2], reset = 0, max(reset, c_until[c] - now)
    else
      out[m + 2] = impl.remaining(c, i_lim[k], i_burst[k])
    end
    if reset < 0 then
      reset = 0
    end
    if retry < 0 and retry ~= RETRY_NEVER then
      retry = 0
    end
    out[m + 3], out[m + 4] = reset, retry
    m = m + 4
  end
end

-- view returns, per item, the remaining and reset µs of the state before
-- the request: what the request shows if another node denies it and this
-- node's reservation is released. Taken before the writes (a sliding
-- log's oldest entry is read from its sorted set).
local function view()
  local sc, st, sp, sr, se = {}, {}, {}, {}, {}
  for c = 1, nc do
    sc[c], st[c], sp[c], sr[c], se[c] = c_count[c], c_tat[c], c_pop[c], c_trim[c], c_pend[c]
    restore(c)
  end
  local v = {}
  for k = 1, n do
    local c = i_ctr[k]
    v[2 * k - 1] = c_impl[c].remaining(c, i_lim[k], i_burst[k])
    v[2 * k] = max(0, c_impl[c].reset_at(c) - now)
  end
  for c = 1, nc do
    c_count[c], c_tat[c], c_pop[c], c_trim[c], c_pend[c] = sc[c], st[c], sp[c], sr[c], se[c]
  end
  return v
end

-- decide judges the request whose arguments start at argv[a] and returns
-- its reply and where the next request's arguments start. A request past
-- its deadline is not decided: its caller has stopped waiting, or will
-- before the reply can reach it.
local function decide(a)
  local head = a - 1 -- request field j is argv[head + j]
  local mode, instant = argv[head + REQUEST_MODE], argv[head + REQUEST_INSTANT]
  local deadline, undo_after = argv[head + REQUEST_DEADLINE], argv[head + REQUEST_UNDO_AFTER]
  local items, width = items_of(a)
  local next_a = a + REQUEST_HEAD + width * items
  if instant == '' and time_now then
    now = time_now -- clock(instant), inline: Redis TIME, read already
  else
    now = clock(instant)
  end
  if deadline ~= '' and now > tonumber(deadline) then
    return { VERDICT_EXPIRED, now }, next_a
  end
  parse(a)
  load()
  local admitted, over = false, nil
  if mode == MODE_PEEK then
    -- Nothing is consumed; what normalization changed is kept, as by any
    -- decision (a sliding log's expired entries are gone from its set).
    judge()
    admitted = rule(mode)
    for c = 1, nc do
      restore(c)
    end
    local out = { admitted and VERDICT_ADMITTED or VERDICT_DENIED, now }
    statuses(out)
    for c = 1, nc do
      c_impl[c].write(c, nil)
      if c_pen[c] then
        penalty_write(c)
      end
    end
    return out, next_a
  elseif mode == MODE_CHARGE then
    for k = 1, n do
      i_ok[k], i_retry[k] = not i_denied[k], 0
    end
    penal = false -- strikes were the reservation's
  elseif plain and mode == MODE_FINAL then
    -- No flags and no groups: the rule is that every item admits, and
    -- nothing is charged when denied.
    admitted = judge()
    settle(admitted, nil)
  else
    judge()
    admitted, over = rule(mode)
    settle(admitted, over)
  end
  if not plain then
    charge_denied(admitted, over)
  end
  if penal then
    strike()
  end
  local reserve = mode == MODE_RESERVE and admitted
  -- The undo log: a reservation's, and, past the undo instant, any
  -- decision's (a denial's too: its hits that count when denied were
  -- charged), for a reply that may come after its caller stopped waiting.
  local undo
  if reserve or (undo_after ~= '' and now > tonumber(undo_after)) then
    undo = {}
  end
  if admitted and plain and hashed and not penal and not undo and mode == MODE_FINAL then
    -- VERDICT_ADMITTED_STATES: the fields as written, statuses left to the
    -- store
    for c = 1, nc do
      c_impl[c].write(c, nil)
    end
    local out = { VERDICT_ADMITTED_STATES, now }
    for k = 1, n do
      local c = i_ctr[k]
      out[k + REPLY_HEAD] = hv[c_key[c]][c_id[c]] or false
    end
    return out, next_a
  end
  local out = { admitted and VERDICT_ADMITTED or VERDICT_DENIED, now }
  statuses(out)
  local v = reserve and view()
  for c = 1, nc do
    c_impl[c].write(c, undo)
    if c_pen[c] then
      penalty_write(c)
    end
  end
  if undo then
    out[#out + 1] = undo
  end
  if reserve then
    out[#out + 1] = v
  end
  return out, next_a
end

-- decide_entry is the FCALL entry point: it decides args[1] requests and
-- returns their replies. An unknown algorithm code (or a rule argument not
-- of RULE_PATTERN) is an error, found before anything is decided (a call
-- that fails halfway keeps the writes it made).
local function decide_entry(_, args)
  bind()
  argv, time_now = args, nil
  local a = 2
  for _ = 1, tonumber(argv[1]) do
    local items, width = items_of(a)
    for k = 1, items do
      local arg = argv[a + REQUEST_HEAD + (k - 1) * width + ITEM_RULE - 1]
      if not (rules[arg] or rule_of(arg)) then
        return redis.error_reply('rls: unknown algorithm in rule ' .. tostring(arg))
      end
    end
    a = a + REQUEST_HEAD + width * items
  end
  hv, hx, grew, nw = {}, {}, {}, 0
  local replies = {}
  a = 2
  for r = 1, tonumber(argv[1]) do
    replies[r], a = decide(a)
  end
  flush()
  return replies
end
