-- decide/reply.lua: what a request's reply says of each item.

-- statuses appends per item: its verdict (REPLY_ITEM_*), remaining, reset
-- and retry µs (from the decision's instant, whatever the counter's own;
-- RETRY_NEVER when no wait admits the item's hits), and for an item whose
-- rule reserves its reservations (holds.status; oldest: MODE_PEEK's).
local function statuses(out, oldest)
  local m = #out
  local reported = holding and {}
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
    if holding and i_spec[k] then
      m = holds.status(out, m, k, reported, oldest)
    end
  end
end

-- view returns, per item, the remaining and reset µs of the state before
-- the request: what the request shows if another node denies it and this
-- node's reservation is released. Taken once the counters are loaded,
-- before the judging pass.
local function view()
  local v = {}
  for k = 1, n do
    local c = i_ctr[k]
    v[2 * k - 1] = c_impl[c].remaining(c, i_lim[k], i_burst[k])
    v[2 * k] = max(0, c_impl[c].reset_at(c) - now)
  end
  return v
end
