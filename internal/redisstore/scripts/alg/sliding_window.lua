-- sliding_window (engine/sliding_window.go): Cloudflare's estimate, the
-- previous window's count weighted by the part of it that the sliding
-- window still overlaps. Its state is a window counter (see
-- alg/fixed_window.lua) whose field holds the previous window's count too,
-- which weighs until the previous window no longer does.

local ALG_SLIDING_WINDOW = 1

local sliding = {}
algorithms[ALG_SLIDING_WINDOW] = sliding

do
  sliding.locate = fixed.locate

  function sliding.load(c)
    window_load(c, now - now % c_w[c], true)
  end

  -- the estimate of a window of w that starts at start, at instant t,
  -- with counts prev and count
  local function weigh(w, t, start, prev, count)
    local weight = (w - (t - start)) / w
    local est = prev * weight
    return est + count
  end

  local function estimate(c)
    return weigh(c_w[c], c_t[c], w_start[c], w_prev[c], w_count[c])
  end

  function sliding.admits(c, hits, limit)
    return hits <= limit and estimate(c) + hits <= limit
  end

  sliding.consume = fixed.consume -- the current window's count
  sliding.give_back = fixed.give_back

  -- A sliding window holds a reserve's hits in its current window's count
  -- (engine's slidingWindow.hold): a window that load rolled takes them
  -- out of the count now previous and starts with them, so that a hold
  -- weighs fully until it ends.
  sliding.hold, sliding.unhold, sliding.rebase = fixed.hold, fixed.unhold, fixed.rebase

  function sliding.carry(c, held)
    if w_start[c] ~= w_s0[c] then
      w_prev[c] = w_prev[c] - min(w_prev[c], held)
      w_count[c], w_count0[c] = w_count[c] + held, w_count0[c] + held
    end
  end

  function sliding.remaining(c, limit)
    local r = limit - estimate(c)
    if r <= 0 then
      return 0
    end
    return floor(r)
  end

  function sliding.reset_at(c)
    return w_start[c] + c_w[c]
  end

  function sliding.retry_at(c, hits, limit)
    local w, ws, count = c_w[c], w_start[c], w_count[c]
    local ending = ws + w
    if hits > limit then
      return never
    end
    if count + hits <= limit then
      -- The previous window's weight has to decay.
      local a = limit - count - hits
      local e = w - a * w / w_prev[c]
      return max(c_t[c] + 1, min(ending, ws + floor(e) - 1))
    end
    -- Only in the next window, where this window becomes the previous one.
    local a = limit - hits
    local e = w - a * w / count
    return max(ending, min(ending + w, ending + floor(e) - 1))
  end

  sliding.restore = window_restore
  sliding.span = 2
  sliding.status_from_field = true
  sliding.write = window_write

  -- lean: as fixed.lean, with window_load's shift (the count of the
  -- window just before weighs as the previous one) and the estimate.
  function sliding.lean(v, r)
    local w = r.w
    local ws = now - now % w
    local start, count, prev, t = ws, 0, 0, now
    if v then
      local s, n, p = window_read(v)
      if ws < s then -- a later window was seen: no time passes before it
        start, count, prev, t = s, n, p, s
      elseif ws - w == s then
        prev = n
      elseif ws == s then
        count, prev = n, p
      end
    end
    if 1 > r.limit or weigh(w, t, start, prev, count) + 1 > r.limit then
      return nil
    end
    return spack(SLIDING_STATE, start, count + 1, prev), start + 2 * w
  end

  sliding.undo = fixed.undo
end
