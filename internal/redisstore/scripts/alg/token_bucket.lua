-- token_bucket (engine/token_bucket.go): GCRA, a bucket of burst tokens
-- refilled at limit per window. Its state is the field of the descriptor's
-- hash that holds the TAT in µs (a STATE_NUMBER), which weighs until it
-- passes (an absent or past TAT is a full bucket). A limit of 0 admits
-- nothing and keeps no state.

local ALG_TOKEN_BUCKET = 3

local bucket = {}
algorithms[ALG_TOKEN_BUCKET] = bucket

do
  -- A bucket (index c): its TAT, the TAT as loaded (for restore and the
  -- undo log) and as stored (0: none, for the write).
  local b_tat, b_tat0, b_stored = {}, {}, {}

  local function interval(c, limit)
    return idiv(c_w[c] + limit - 1, limit)
  end

  bucket.locate = need_hash

  function bucket.load(c)
    local stored = number_read(hv[c_key[c]][c_id[c]])
    local tat = stored > now and stored or now
    b_tat[c], b_tat0[c], c_t[c], b_stored[c] = tat, tat, now, stored
  end

  function bucket.admits(c, hits, limit, burst)
    if limit == 0 then
      return hits == 0
    end
    if hits > burst then
      return false
    end
    local i = interval(c, limit)
    return b_tat[c] + hits * i - now <= burst * i
  end

  function bucket.consume(c, hits, limit)
    if limit > 0 then
      local tat = b_tat[c]
      b_tat[c] = min(tat + hits * interval(c, limit), max(tat, now + TB_MAX_AHEAD))
    end
  end

  function bucket.give_back(c, hits, limit)
    if limit == 0 then
      return
    end
    local i = interval(c, limit)
    if hits >= idiv(b_tat[c] - now + i - 1, i) then
      b_tat[c] = now
    else
      b_tat[c] = b_tat[c] - hits * i
    end
  end

  -- A bucket holds a reserve's hits as tokens taken (engine's
  -- tokenBucket.hold): its TAT has them, and a hold that ends gives them
  -- back.
  bucket.hold = bucket.consume
  bucket.unhold = bucket.give_back

  function bucket.carry()
  end

  function bucket.rebase(c)
    b_tat0[c] = b_tat[c]
  end

  function bucket.restore(c)
    b_tat[c] = b_tat0[c]
  end

  function bucket.remaining(c, limit, burst)
    if limit == 0 then
      return 0
    end
    local i = interval(c, limit)
    local tau = burst * i
    local d = b_tat[c] - now
    if d >= tau then
      return 0
    end
    return idiv(tau - d, i)
  end

  function bucket.reset_at(c)
    return b_tat[c]
  end

  function bucket.retry_at(c, hits, limit, burst)
    if limit == 0 or hits > burst then
      return never
    end
    local i = interval(c, limit)
    return b_tat[c] + hits * i - burst * i
  end

  function bucket.write(c, undo)
    local key, id, tat, tat0 = c_key[c], c_id[c], b_tat[c], b_tat0[c]
    if tat < tat0 then
      freed(counter_key(key, id))
    end
    if tat <= now then
      if b_stored[c] > 0 then
        stage(key, id, false, 0) -- a full bucket: no state
      end
    elseif tat ~= b_stored[c] then
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

  bucket.status_from_field = true

  -- lean: as fixed.lean (alg/fixed_window.lua) for a bucket: load, admits,
  -- consume and write above, for one hit. A consumption moves the TAT past
  -- now: the field is always written.
  function bucket.lean(v, r)
    local limit, burst = r.limit, r.burst
    if limit == 0 or burst < 1 then
      return nil
    end
    local stored = number_read(v)
    local tat = stored > now and stored or now
    local i = r.interval
    if not i then
      i = idiv(r.w + limit - 1, limit)
      r.interval = i
    end
    if tat + i - now > burst * i then
      return nil
    end
    tat = min(tat + i, max(tat, now + TB_MAX_AHEAD))
    return spack(STATE_NUMBER, tat), tat
  end
  bucket.undo = { [UNDO_TAT] = undo_tat }
end
