-- fixed_window (engine/fixed_window.go): hits counted per window, windows
-- aligned to the epoch. Its state is a window counter (below), which the
-- calendar and sliding windows count with too (alg/calendar_window.lua,
-- alg/sliding_window.lua), as the engine's calendar window embeds its
-- fixed window: a field of the descriptor's hash that holds the window's
-- start and count, which weigh until the window ends.

local ALG_FIXED_WINDOW = 0

-- A window counter (index c): start, count and the previous window's
-- count (a sliding window's), and the count as loaded (count0, for
-- restore and the undo log); the *0 arrays hold the stored state (start
-- false: none), for the write. Its field packs start and count, and a
-- sliding window's previous count, as STATE_NUMBER values.
local w_start, w_count, w_count0, w_prev = {}, {}, {}, {}
local w_s0, w_n0, w_p0 = {}, {}, {}
local WINDOW_STATE, SLIDING_STATE = '<dd', '<ddd'

-- window_read returns a window counter's start, count and previous count
-- from its field's value (false: absent), or nil for no state.
local function window_read(v)
  if not v then
    return nil
  end
  if #v == 24 then
    local start, count, prev = sunpack(SLIDING_STATE, v)
    return start, count, prev
  end
  local start, count = sunpack(WINDOW_STATE, v)
  return start, count, 0
end

-- the field value of a window counter's state; prev only in a sliding window's
local function window_value(start, count, prev, sliding)
  if sliding then
    return spack(SLIDING_STATE, start, count, prev)
  end
  return spack(WINDOW_STATE, start, count)
end

-- A window counter's expiry: a count weighs for span windows of w from
-- its window's start, a previous count for one.
local function window_expiry(start, count, prev, w, span)
  if count > 0 then
    return start + span * w
  elseif prev > 0 then
    return start + w
  end
  return 0
end

-- window_load loads a window counter's state (see window_read), its window
-- rolled to the one starting at ws (shift: a count of the window just
-- before weighs as the previous one, as in a sliding window); with a state
-- that has seen a later window, the counter keeps it and its instant is
-- that window's start.
local function window_load(c, ws, shift)
  local start, count, prev = window_read(hv[c_key[c]][c_id[c]])
  w_s0[c], w_n0[c], w_p0[c] = start or false, count, prev
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
  w_start[c], w_count[c], w_count0[c], w_prev[c], c_t[c] = start, count, count, prev, t
end

-- window_restore undoes the judging pass on a window counter.
local function window_restore(c)
  w_count[c] = w_count0[c]
end

-- A window counter's write: its field staged when its state changed,
-- deleted once the state is equivalent to none (expires not after now:
-- memstore forgets such a counter too). undo logs the request's delta. w is
-- the length of the counter's window (default its rule's), and span the
-- windows a count weighs for (its algorithm's span).
local function window_write(c, undo, w)
  w = w or c_w[c]
  local span = c_impl[c].span
  local start, count, prev = w_start[c], w_count[c], w_prev[c]
  local delta = count - w_count0[c]
  if delta < 0 then
    freed(counter_key(c_key[c], c_id[c]))
  end
  local expires = window_expiry(start, count, prev, w, span)
  if expires <= now then
    if w_s0[c] then
      stage(c_key[c], c_id[c], false, 0)
    end
  elseif start ~= w_s0[c] or count ~= w_n0[c] or prev ~= w_p0[c] then
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

local fixed = {}
algorithms[ALG_FIXED_WINDOW] = fixed

fixed.locate = need_hash

function fixed.load(c)
  window_load(c, now - now % c_w[c], false)
end

function fixed.admits(c, hits, limit)
  return hits <= limit and w_count[c] + hits <= limit
end

function fixed.consume(c, hits)
  w_count[c] = w_count[c] + hits
end

-- give_back refunds hits, never below the hits held (a refund does not
-- end a reservation).
function fixed.give_back(c, hits)
  local count = w_count[c]
  local free = count
  if c_hold[c] then
    free = count - min(count, c_held[c])
  end
  w_count[c] = count - min(free, hits)
end

-- A window holds a reserve's hits in its count (engine's fixedWindow.hold),
-- which carries them into each new window while they are held: a window
-- that load rolled (its start is not the stored one) starts with them.
fixed.hold = fixed.consume

function fixed.unhold(c, hits)
  w_count[c] = w_count[c] - min(w_count[c], hits)
end

function fixed.carry(c, held)
  if w_start[c] ~= w_s0[c] then
    w_count[c], w_count0[c] = w_count[c] + held, w_count0[c] + held
  end
end

function fixed.rebase(c)
  w_count0[c] = w_count[c]
end

function fixed.remaining(c, limit)
  local count = w_count[c]
  if count >= limit then -- limit - min(limit, count), without a call
    return 0
  end
  return limit - count
end

function fixed.reset_at(c)
  return w_start[c] + c_w[c]
end

function fixed.retry_at(c, hits, limit)
  if hits > limit then
    return never
  end
  return w_start[c] + c_w[c]
end

fixed.restore = window_restore
fixed.span = 1
fixed.status_from_field = true
fixed.write = window_write

-- lean is the whole decision of a plain hit (one hit, no flags: see
-- decide/lean.lua) on the counter of rule r whose field holds v (false:
-- none), at now: load, admits, consume and write above, in one step. It
-- returns the field's new value and its expiry, or nil when the hit is not
-- admitted (the general path then decides the request).
function fixed.lean(v, r)
  local w = r.w
  local start, count = now - now % w, 0
  if v then
    local s, n = sunpack(WINDOW_STATE, v)
    if s >= start then -- this window, or a later one seen: kept
      start, count = s, n
    end
  end
  if count + 1 > r.limit then
    return nil
  end
  return spack(WINDOW_STATE, start, count + 1), start + w
end

fixed.undo = { [UNDO_WINDOW] = undo_window }
