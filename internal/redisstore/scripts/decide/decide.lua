-- decide/decide.lua: the decide function, its phases in order
-- (engine.Evaluate), and its entry point.

-- write writes what the request changed of every counter (its algorithm's
-- write, its penalty's), and appends to undo, when not nil, the operations
-- that give it back.
local function write(undo)
  for c = 1, nc do
    c_impl[c].write(c, undo)
    if c_pen[c] then
      penalty_write(c)
    end
  end
  if holding then
    for c = 1, nc do
      if c_hold[c] then
        holds.write(c, undo)
      end
    end
  end
end

-- decide judges the request whose arguments start at argv[a] and returns
-- its reply and where the next request's arguments start. A request past
-- its deadline is not decided: its caller has stopped waiting, or will
-- before the reply can reach it.
local function decide(a)
  local head = a - 1 -- request field j is argv[head + j]
  local mode, instant = argv[head + REQUEST_MODE], argv[head + REQUEST_INSTANT]
  local deadline, undo_after = argv[head + REQUEST_DEADLINE], false
  local items, width = items_of(a)
  local next_a = a + REQUEST_HEAD + width * items
  if instant == '' and time_now then
    now = time_now -- clock(instant), inline: Redis TIME, read already
  else
    now = clock(instant)
  end
  if deadline ~= '' then
    local d
    d, undo_after = sunpack(DEADLINE_PACK, deadline)
    if now > d then
      return { VERDICT_EXPIRED, now }, next_a
    end
  end
  if width == PLAIN_ITEM_FIELDS and mode == MODE_FINAL and not (undo_after and now > undo_after) then
    local out = lean(a + REQUEST_HEAD - 1, items)
    if out then
      return out, next_a
    end
  end
  parse(a)
  load()
  if reserving then
    holds.phases()
  end
  local v = mode == MODE_RESERVE and view()
  local admitted, over = false, nil
  if mode == MODE_PEEK then
    -- Nothing is consumed; what normalization changed is kept, as by any
    -- decision (a sliding log's expired entries are gone from its set).
    judge()
    admitted = rule(mode)
    restore()
    local out = { admitted and VERDICT_ADMITTED or VERDICT_DENIED, now }
    statuses(out, true)
    write(nil)
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
    conclude(admitted, nil)
  else
    judge()
    admitted, over = rule(mode)
    conclude(admitted, over)
  end
  if not plain then
    charge_denied(admitted, over)
  end
  local reserve = mode == MODE_RESERVE and admitted
  -- The undo log: a reservation's, and, past the undo instant, any
  -- decision's (a denial's too: its hits that count when denied were
  -- charged, its settles settled), for a reply that may come after its
  -- caller stopped waiting.
  local undo
  if reserve or (undo_after and now > undo_after) then
    undo = {}
  end
  if reserving then
    holds.settle(admitted, over, undo)
  end
  if penal then
    strike()
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
  statuses(out, false)
  write(undo)
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
local replies = {} -- the call's replies (decide_entry), reused
local function decide_entry(_, args)
  if not call then
    bind() -- once: the standard functions stay bound
  end
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
  a = 2
  local count = tonumber(argv[1])
  for r = 1, count do
    replies[r], a = decide(a)
  end
  flush()
  return { unpack(replies, 1, count) } -- made at its size at once
end
