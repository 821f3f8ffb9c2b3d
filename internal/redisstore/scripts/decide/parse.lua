-- decide/parse.lua: the first phase of a request, its items read from the
-- arguments and their counters found (each algorithm's locate).

-- rules caches the parsed rules by their argument (ITEM_RULE): a rule is
-- sent with every request, parsed at its first. At most max_rules are
-- kept (calendar windows make new ones as their bounds move).
local rules, nrules, max_rules = {}, 0, 4096

-- rule_of returns the rule of an ITEM_RULE argument: code, w (µs; false
-- for a calendar window), warg (the window argument), limit, burst, id,
-- impl (its algorithm), pen (its penalty, penalty_of) and hold (its
-- reserve, engine.Rule.ReserveArg: { estimate = hits, ttl = µs }, false
-- for none); nil for an argument that names no known algorithm. An algorithm's locate may keep what it derives from the rule
-- in its table.
local function rule_of(arg)
  local r = rules[arg]
  if r then
    return r
  end
  local code, warg, limit, burst, pen, res, id = match(arg, RULE_PATTERN)
  local impl = code and algorithms[tonumber(code)]
  if not impl then
    return nil
  end
  if nrules >= max_rules then
    rules, nrules = {}, 0
  end
  local estimate, ttl = match(res, '^(%d+):(%d+)$')
  r = { code = tonumber(code), w = tonumber(warg) or false, warg = warg, limit = tonumber(limit), burst = tonumber(burst), id = id, impl = impl,
        pen = penalty_of(pen), hold = estimate and { estimate = tonumber(estimate), ttl = tonumber(ttl) } or false }
  -- lean: the lean path decides its plain items (decide/lean.lua)
  r.lean = impl.lean ~= nil and not r.pen and not r.hold
  rules[arg], nrules = r, nrules + 1
  return r
end

-- items_of returns the number of items of the request whose arguments
-- start at argv[a], and the fields each item takes.
-- Read once per argument (a tonumber is a strtod): counts and widths by
-- REQUEST_ITEMS argument, at most max_counts of them.
local items_of
do
  local counts, widths, ncounts, max_counts = {}, {}, 0, 1024
  function items_of(a)
    local arg = argv[a + REQUEST_ITEMS - 1]
    local m = counts[arg]
    if m then
      return m, widths[arg]
    end
    local width
    m = tonumber(arg)
    if not m then -- RESERVING_ITEMS and the number
      m, width = tonumber(arg:sub(#RESERVING_ITEMS + 1)), RESERVING_ITEM_FIELDS
    elseif m < 0 then
      m, width = -m, PLAIN_ITEM_FIELDS
    else
      width = ITEM_FIELDS
    end
    if ncounts >= max_counts then
      counts, widths, ncounts = {}, {}, 0
    end
    counts[arg], widths[arg], ncounts = m, width, ncounts + 1
    return m, width
  end
end

-- parse reads the items of the request whose arguments start at argv[a]
-- and finds their counters, each once, with the hashes they need read.
local function parse(a)
  local width
  n, width = items_of(a)
  nc, nk, plain, penal, hashed = 0, 0, true, false, true
  holding, reserving = false, width == RESERVING_ITEM_FIELDS
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
      c_key[c], c_id[c], c_w[c], c_impl[c], c_pen[c], c_hold[c] = key, id, r.w, r.impl, false, false
      if not r.impl.status_from_field then
        hashed = false
      end
      if r.impl.locate == need_hash then
        need(key) -- need_hash's work, one call less
      else
        r.impl.locate(c, r)
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
    local hold = r.hold
    i_spec[k] = hold
    if hold then
      holding, hashed = true, false -- its statuses carry its reservations
      if not c_hold[c] then
        c_hold[c] = hold
        need(key) -- the held hits' field, for a sliding log too
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
    if reserving then
      local res = argv[f + ITEM_RESERVATION]
      i_res[k] = hold and res ~= '' and not i_refund[k] and res -- a reservation call (engine's Item.Reserving)
    end
  end
end
