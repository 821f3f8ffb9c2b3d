-- decide/judge.lua: the judging pass and the all-or-nothing rule
-- (engine.Evaluate's judge and Admit, and the judging pass undone or kept).

-- apply applies admitted item k to its counter (engine's apply): a
-- reserve holds its hits; a settle and a repeat change nothing here
-- (reserve.lua).
local function apply(k)
  local c = i_ctr[k]
  if i_refund[k] then
    c_impl[c].give_back(c, i_hits[k], i_lim[k])
  elseif not (reserving and i_res[k]) then
    c_impl[c].consume(c, i_hits[k], i_lim[k])
  elseif not i_free[k] then -- a reserve
    c_impl[c].hold(c, i_hits[k], i_lim[k])
  end
end

-- retry sets when denied item k could pass, as of the decision's instant,
-- or RETRY_NEVER (engine's retry): while its counter holds hits of
-- reservations, no later than its table's next event.
local function retry(k)
  local c = i_ctr[k]
  local at = c_impl[c].retry_at(c, i_hits[k], i_lim[k], i_burst[k])
  if at == never then
    i_retry[k] = RETRY_NEVER
    return
  end
  if holding and c_hold[c] and c_held[c] > 0 and c_next[c] > 0 then
    at = min(at, c_next[c])
  end
  i_retry[k] = at - now
end

-- judge is the judging pass: each item in order, consumed tentatively when
-- it admits (engine's judge). It returns whether every item admits.
local function judge()
  local all = true
  for k = 1, n do
    local c, hits, limit, burst = i_ctr[k], i_hits[k], i_lim[k], i_burst[k]
    local impl = c_impl[c]
    i_retry[k] = 0
    if reserving and i_free[k] then
      i_ok[k] = true -- a settle, or a repeat (reserve.lua)
    elseif not i_refund[k] and blocked(k) then
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
      apply(k)
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

-- restore undoes the judging pass on every counter.
local function restore()
  for c = 1, nc do
    c_impl[c].restore(c)
  end
end

-- conclude undoes the judging pass unless the request is admitted as
-- judged, and consumes again without the quota groups that are over.
local function conclude(admitted, over)
  if admitted and not over then
    return
  end
  restore()
  if admitted then
    for k = 1, n do
      if i_ok[k] and not over[i_group[k]] then
        apply(k)
      end
    end
  end
end
