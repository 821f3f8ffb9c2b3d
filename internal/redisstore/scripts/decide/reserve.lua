-- decide/reserve.lua: reservations (engine/reservation.go), the table of
-- each counter whose limit reserves, phase by phase: load reads the
-- counter's hits held, carries them into its state and sweeps its table's
-- due events (holds.load); the calls' phases (holds.phases); the judging
-- pass judges a reserve as its hold's hits and admits a settle (judge.lua,
-- through i_free and the algorithms' hold); once the outcome is known the
-- holds of an admitted request's reserves are recorded and the settles
-- settled (holds.settle); the write stages the held field and logs the
-- undo (holds.write); the statuses add the reservations (holds.status).
--
-- A counter's table lives beside it, in its slot (engine.HeldField,
-- engine.ReservationKeys): the hash of its records at its counter's key
-- and RECORDS_SUFFIX (id → its hits held, the instant it was reserved and
-- its hold's end, and its state, packed as RECORD_STATE), and the sorted
-- set of its ids by their next event at its counter's key and
-- EVENTS_SUFFIX (a held record's hold's end, then, once it ended, the
-- instant it is forgotten: a ttl later). The field of its rule ID and
-- HELD_SUFFIX in the descriptor's hash holds its hits held, its holds, and
-- its table's next event (the sorted set's lowest score), packed as
-- HELD_STATE: load reads it with the hash, and reads the sorted set only
-- when an event is due. Records and events are written at once (the
-- request's own, or normalization); the field is staged with the hash.
--
-- The file's part of the wire contract (its constants have the names of
-- wire.go's in upper snake case; TestWireContract checks them): an item
-- whose rule reserves has REPLY_HOLD_FIELDS more in its reply: its phase
-- (PHASE_*: what its reservation call was), the hits it held or released,
-- its counter's hits held and holds after the decision, the age in µs of
-- the oldest hold (MODE_PEEK only, else 0), and the holds of the counter
-- that ended by themselves at the decision and their hits (on the first
-- such item of the counter); see engine.Result. A request's undo log gives
-- back what it did to a counter's reservations with UNDO_HOLD.
--
-- The library's top level is near Lua's 200 locals: this file keeps all
-- but what the other phases use in the block below.

-- What the other phases use: the items' reservation ids (parse), whether
-- an item is admitted without being judged (a settle, or a repeat of a
-- call on its counter), the counters' next events (retry), and the
-- phases' functions.
local i_res, i_free, c_next = {}, {}, {}
local holds = {}

do
  local HELD_SUFFIX = '!h'
  local RECORDS_SUFFIX = '!r'
  local EVENTS_SUFFIX = '!e'
  local REPLY_HOLD_FIELDS = 7
  local PHASE_NONE = 0
  local PHASE_RESERVING = 1
  local PHASE_SETTLING = 2
  local PHASE_SETTLED_AGAIN = 3
  local PHASE_SETTLING_UNHELD = 4
  local UNDO_HOLD = 'H' -- key field held live records events count (id record score)...:
                        -- a counter's held hits and holds less those deltas, its
                        -- records and their events put back ('' for none)
  local RECORD_STATE, HELD_STATE = '<dddd', '<ddd'
  local RECORD_HELD, RECORD_SETTLED, RECORD_LAPSED = 0, 1, 2
  -- the most due events one decision handles on one counter (engine's
  -- MaxSweep): the others wait, holding their hits meanwhile
  local MAX_SWEEP = 128

  -- Items (index k) that are reservation calls: i_phase, the phase;
  -- i_rhits, the call's own hits (i_hits is what the judging pass judges:
  -- a reserve's hold); i_holdhits, the hits it held or released.
  local i_phase, i_rhits, i_holdhits = {}, {}, {}
  -- Counters (index c) with c_hold: tab[c], their table as this request
  -- sees it: live (holds), hv0 (the held field as loaded), rkey and ekey
  -- (the keys of their records and events), lim (the limit their sweep
  -- gives back under: the first item's whose rule reserves), lapsed and
  -- lhits (the holds that ended by themselves at load and their hits,
  -- counted), swept and shits (all the holds load released and their
  -- hits, counted or forgotten at once),
  -- undo (the records the request changed, as they were: for the undo
  -- log), changed (their events changed), forget (the latest instant a
  -- record added is forgotten), rid and rec (a record looked up: its id,
  -- its value or false).
  local tab = {}

  -- next_event returns the lowest score of events key ekey (0 for none).
  local function next_event(ekey)
    local first = call('ZRANGE', ekey, 0, 0, 'WITHSCORES')
    return first[2] and tonumber(first[2]) or 0
  end

  -- record returns the value of counter c's record of id (false for none),
  -- looked up once per counter and id.
  local function record(c, id)
    local t = tab[c]
    if t.rid ~= id then
      t.rid, t.rec = id, call('HGET', t.rkey, id)
    end
    return t.rec
  end

  -- put_record writes counter c's record of id, holding hits from at
  -- until untl, in state, with its next event; notes what it was when the
  -- request logs an undo.
  local function put_record(c, id, hits, at, untl, state)
    local t = tab[c]
    if t.undo then
      local prev = call('HGET', t.rkey, id)
      local ps = prev and call('ZSCORE', t.ekey, id)
      t.undo[#t.undo + 1] = { id, prev or '', ps or '' }
    end
    local score = untl
    if state ~= RECORD_HELD then
      score = untl + (untl - at) -- forgotten a ttl after its hold's end
    end
    call('HSET', t.rkey, id, spack(RECORD_STATE, hits, at, untl, state))
    call('ZADD', t.ekey, fmt(score), id)
    t.rid, t.changed = false, true
  end

  -- sweep handles counter c's due events at its instant (engine's sweep):
  -- a held record's hold ends by itself (its hits back, unhold; the record
  -- lapsed, remembered until it is forgotten, or forgotten at once,
  -- uncounted, when that instant has passed too), a record past that is
  -- forgotten.
  local function sweep(c)
    local t, impl = tab[c], c_impl[c]
    local due = call('ZRANGEBYSCORE', t.ekey, '-inf', fmt(c_t[c]), 'LIMIT', 0, MAX_SWEEP)
    if #due > 0 then
      local recs = call('HMGET', t.rkey, unpack(due))
      for j = 1, #due do
        local id, v = due[j], recs[j]
        local hits, at, untl, state = 0, 0, 0, RECORD_SETTLED
        if v then
          hits, at, untl, state = sunpack(RECORD_STATE, v)
        end
        if v and state == RECORD_HELD then
          impl.unhold(c, hits, t.lim)
          c_held[c], t.live = c_held[c] - min(c_held[c], hits), t.live - 1
          t.swept, t.shits = t.swept + 1, t.shits + hits
          if untl + (untl - at) > c_t[c] then
            t.lapsed, t.lhits = t.lapsed + 1, t.lhits + hits
            put_record(c, id, 0, at, untl, RECORD_LAPSED)
          else -- forgotten too: uncounted, as a counter's expiry forgets it
            call('HDEL', t.rkey, id)
            call('ZREM', t.ekey, id)
          end
        else
          call('HDEL', t.rkey, id)
          call('ZREM', t.ekey, id)
        end
      end
      impl.rebase(c) -- normalization: not the request's, whatever its outcome
    end
    t.changed = false
    c_next[c] = next_event(t.ekey)
  end

  -- holds.load reads counter c's held field, carries its hits held into
  -- its state (its algorithm's carry), and sweeps its due events.
  function holds.load(c)
    local v = hv[c_key[c]][c_id[c] .. HELD_SUFFIX] or false
    local held, live, nxt = 0, 0, 0
    if v then
      held, live, nxt = sunpack(HELD_STATE, v)
    end
    local base, lim = counter_key(c_key[c], c_id[c]), 0
    for k = 1, n do
      if i_ctr[k] == c and i_spec[k] then
        lim = i_lim[k]
        break
      end
    end
    tab[c] = { live = live, hv0 = v, rkey = base .. RECORDS_SUFFIX, ekey = base .. EVENTS_SUFFIX, lim = lim,
               lapsed = 0, lhits = 0, swept = 0, shits = 0, undo = false, changed = false, forget = 0, rid = false, rec = false }
    c_held[c], c_next[c] = held, nxt
    if held > 0 then
      c_impl[c].carry(c, held)
    end
    if nxt > 0 and nxt <= c_t[c] then
      sweep(c)
    end
  end

  -- holds.phases sets each reservation call's phase (engine's phases),
  -- from its counter's table: an id it does not know reserves, one it
  -- holds settles; a repeat on a counter does nothing. A reserve is judged as its hold's hits (i_hits); no
  -- reservation call is count-denied.
  function holds.phases()
    for k = 1, n do
      local id = i_res[k]
      i_phase[k], i_free[k], i_holdhits[k] = PHASE_NONE, false, 0
      if id then
        local c = i_ctr[k]
        i_rhits[k], i_cd[k] = i_hits[k], false
        for j = 1, k - 1 do
          if i_res[j] == id and i_ctr[j] == c then
            i_free[k] = true -- a repeat
          end
        end
        if not i_free[k] then
          local v, state = record(c, id), false
          if v then
            local _
            _, _, _, state = sunpack(RECORD_STATE, v)
          end
          if not v then
            i_phase[k] = PHASE_RESERVING
            if i_hits[k] <= 1 then
              i_hits[k] = i_spec[k].estimate
            end
          elseif state == RECORD_HELD then
            i_phase[k], i_free[k] = PHASE_SETTLING, true
          elseif state == RECORD_SETTLED then
            i_phase[k], i_free[k] = PHASE_SETTLED_AGAIN, true
          else
            i_phase[k], i_free[k] = PHASE_SETTLING_UNHELD, true
          end
        end
      end
    end
  end

  -- holds.settle records the holds of the reserves that an admitted
  -- request consumed (not in a quota group that is over), and settles the
  -- settles whatever the outcome (engine's reserveAndSettle). With undo
  -- (the write logs an undo), each record's value before is noted.
  function holds.settle(admitted, over, undo)
    for k = 1, n do
      local p = i_phase[k]
      if p ~= PHASE_NONE then
        local c, id = i_ctr[k], i_res[k]
        local impl, t, tc = c_impl[c], tab[c], c_t[c]
        if undo and not t.undo then
          t.undo = {}
        end
        if p == PHASE_RESERVING then
          if admitted and i_ok[k] and not (over and over[i_group[k]]) then
            local hits, untl = i_hits[k], tc + i_spec[k].ttl
            i_holdhits[k] = hits
            put_record(c, id, hits, tc, untl, RECORD_HELD)
            t.forget = max(t.forget, untl + i_spec[k].ttl)
            c_held[c], t.live = c_held[c] + hits, t.live + 1
          end
        elseif p == PHASE_SETTLING then
          local hits, at, untl = sunpack(RECORD_STATE, record(c, id))
          i_holdhits[k] = hits
          impl.unhold(c, hits, i_lim[k])
          c_held[c], t.live = c_held[c] - min(c_held[c], hits), t.live - 1
          put_record(c, id, 0, at, untl, RECORD_SETTLED)
          impl.consume(c, i_rhits[k], i_lim[k])
        elseif p == PHASE_SETTLING_UNHELD then
          local _, at, untl = sunpack(RECORD_STATE, record(c, id))
          put_record(c, id, 0, at, untl, RECORD_SETTLED)
          impl.consume(c, i_rhits[k], i_lim[k])
        end
      end
    end
  end

  -- grow_expiry makes key, when it exists, live at least until the
  -- instant untl.
  local function grow_expiry(key, untl)
    local want = ttl_ms(untl, now)
    local pttl = call('PTTL', key)
    if pttl == -1 or pttl >= 0 and pttl < tonumber(want) then
      call('PEXPIRE', key, want)
    end
  end

  -- holds.write stages counter c's held field when it changed (deleted
  -- once nothing is held or remembered), makes its table's keys live as
  -- long as their records, and appends to undo (when not nil) the
  -- operation that gives back what the request did to its reservations.
  function holds.write(c, undo)
    local t = tab[c]
    local key, field = c_key[c], c_id[c] .. HELD_SUFFIX
    local held, live, nxt = c_held[c], t.live, c_next[c]
    if t.changed then
      nxt = next_event(t.ekey)
    end
    local v = (held > 0 or live > 0 or nxt > 0) and spack(HELD_STATE, held, live, nxt)
    if v ~= t.hv0 then
      stage(key, field, v, t.forget)
    end
    if t.forget > 0 then
      grow_expiry(t.rkey, t.forget)
      grow_expiry(t.ekey, t.forget)
    end
    local u = t.undo
    if undo and u and #u > 0 then
      local h0, l0 = 0, 0
      if t.hv0 then
        h0, l0 = sunpack(HELD_STATE, t.hv0)
      end
      -- What the sweep did is normalization: the deltas are the request's.
      local op = { UNDO_HOLD, key, field, fmt(held - (h0 - t.shits)), fmt(live - (l0 - t.swept)), t.rkey, t.ekey, #u }
      for j = 1, #u do
        op[#op + 1], op[#op + 2], op[#op + 3] = u[j][1], u[j][2], u[j][3]
      end
      undo[#undo + 1] = op
    end
  end

  -- holds.status appends item k's reservation fields (REPLY_HOLD_FIELDS)
  -- to out after m and returns where they end; reported holds the
  -- counters whose ended holds an earlier item reported. With oldest
  -- (MODE_PEEK), the age of its counter's oldest hold.
  function holds.status(out, m, k, reported, oldest)
    local c = i_ctr[k]
    local t = tab[c]
    local lapsed, lhits, age = 0, 0, 0
    if not reported[c] then
      reported[c] = true
      lapsed, lhits = t.lapsed, t.lhits
    end
    if oldest and t.live > 0 then
      local ids, first = call('ZRANGE', t.ekey, 0, -1), false
      local recs = #ids > 0 and call('HMGET', t.rkey, unpack(ids)) or {}
      for j = 1, #recs do
        if recs[j] then
          local _, at, _, state = sunpack(RECORD_STATE, recs[j])
          if state == RECORD_HELD and (not first or at < first) then
            first = at
          end
        end
      end
      if first then
        age = max(0, now - first)
      end
    end
    local p = i_phase[k]
    if not (reserving and i_res[k]) then
      p = PHASE_NONE
    end
    out[m + 1], out[m + 2], out[m + 3], out[m + 4] = p, p == PHASE_NONE and 0 or i_holdhits[k], c_held[c], t.live
    out[m + 5], out[m + 6], out[m + 7] = age, lapsed, lhits
    return m + REPLY_HOLD_FIELDS
  end

  -- The undo of a request's reservations (UNDO_HOLD at args[i]): its
  -- records and their events put back as they were, its counter's held
  -- hits and holds less the request's deltas, the next event counted
  -- again. It returns where the next operation starts. (The counter's own
  -- state is its algorithm's undo.)
  local function undo_hold(args, i, now)
    local key, field = args[i + 1], args[i + 2]
    local dheld, dlive = tonumber(args[i + 3]), tonumber(args[i + 4])
    local rkey, ekey, m = args[i + 5], args[i + 6], tonumber(args[i + 7])
    local j = i + 8
    for _ = 1, m do
      local id, v, score = args[j], args[j + 1], args[j + 2]
      if v == '' then
        call('HDEL', rkey, id)
        call('ZREM', ekey, id)
      else
        call('HSET', rkey, id, v)
        call('ZADD', ekey, score, id)
      end
      j = j + 3
    end
    local v = call('HGET', key, field)
    local held, live = 0, 0
    if v then
      held, live = sunpack(HELD_STATE, v)
    end
    held, live = max(0, held - dheld), max(0, live - dlive)
    local nxt = next_event(ekey)
    set_field(key, field, (held > 0 or live > 0 or nxt > 0) and spack(HELD_STATE, held, live, nxt), 0, now)
    return j
  end

  holds.undo = { [UNDO_HOLD] = undo_hold }
end
