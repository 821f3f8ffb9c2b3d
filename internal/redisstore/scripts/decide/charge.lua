-- decide/charge.lua: the hits that count when denied, charged.

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
