-- calendar window (engine/calendar_window.go): a fixed window on a time
-- zone's calendar (a fixed_window with calendar: true). The store computes,
-- around its own clock, the starts of the previous, current and next
-- windows and the next one's end, and sends them as the item's window
-- ("b1:b2:b3:b4", in µs): Redis's clock falls in one of them. Its state is
-- a fixed window's counter (alg/fixed_window.lua).

local ALG_CALENDAR_WINDOW = 4

local calendar = {}
algorithms[ALG_CALENDAR_WINDOW] = calendar

do
  -- A calendar window (index c): the bounds sent, {b1, b2, b3, b4}.
  local c_bounds = {}

  -- locate parses the bounds of rule r once (a rule's argument carries
  -- its bounds: a rule of other bounds is another rule).
  function calendar.locate(c, r)
    local b = r.bounds
    if not b then
      local b1, b2, b3, b4 = match(r.warg, '^(%d+):(%d+):(%d+):(%d+)$')
      b = { tonumber(b1), tonumber(b2), tonumber(b3), tonumber(b4) }
      r.bounds = b
    end
    c_bounds[c] = b
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
  calendar.hold, calendar.unhold, calendar.carry, calendar.rebase = fixed.hold, fixed.unhold, fixed.carry, fixed.rebase

  function calendar.reset_at(c)
    return calendar_end(c, w_start[c])
  end

  function calendar.retry_at(c, hits, limit)
    if hits > limit then
      return never
    end
    return calendar.reset_at(c)
  end

  calendar.restore = window_restore
  calendar.span = 1

  function calendar.write(c, undo)
    window_write(c, undo, calendar_end(c, w_start[c]) - w_start[c])
  end

  calendar.undo = fixed.undo
end
