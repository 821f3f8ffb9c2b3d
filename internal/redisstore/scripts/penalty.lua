-- penalty.lua: penalties (engine/penalty.go). A denial by a penalized
-- counter's count is a strike that blocks the counter for the next step of
-- the ladder; a block denies without judging, and after the penalty's
-- reset has passed since a block's end the ladder starts over. Whatever
-- its algorithm, a counter's strikes and block end are the field of its
-- rule ID and PENALTY_SUFFIX in its descriptor's hash, packed as two
-- STATE_NUMBER values (the block end, then the strikes).

local PENALTY_STATE = '<dd'

-- i_pen[k]: item k's penalty (its rule's: reset and steps) or false;
-- i_blocked[k]: the judging pass found its counter blocked. A penalized
-- counter (c_pen: the penalty of its first penalized item, else false):
-- its strikes and block end, and the field's value as loaded. penal: the
-- request has penalized items.
local i_pen, i_blocked = {}, {}
local c_pen, c_strikes, c_until, c_pv0 = {}, {}, {}, {}
local penal

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

-- penalty_load reads counter c's strikes and block end, the ladder started
-- over when the quiet time has passed at the counter's instant (forgive).
local function penalty_load(c)
  local v = hv[c_key[c]][c_id[c] .. PENALTY_SUFFIX] or false
  local strikes, untl = 0, 0
  if v then
    untl, strikes = sunpack(PENALTY_STATE, v)
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
  local v = c_strikes[c] > 0 and spack(PENALTY_STATE, c_until[c], c_strikes[c])
  if v ~= c_pv0[c] then
    stage(c_key[c], c_id[c] .. PENALTY_SUFFIX, v, c_until[c] + c_pen[c].reset)
  end
end
