-- decide/lean.lua: the lean path, the decision of the request that Envoy
-- sends most: its items plain (one hit each, no flags, no group), in
-- MODE_FINAL, with no undo log, each on a counter of its own whose rule has
-- a lean step (its algorithm's lean: fixed and sliding windows, token
-- buckets) and no penalty or reserve. Each item's field is judged and its
-- next value computed by the lean step alone, without the general path's
-- per-item and per-counter tables (the Lua interpreter spent most of a
-- decision's instructions filling and reading them); an admitted request
-- writes the new values (below) and is answered VERDICT_ADMITTED_STATES,
-- as the general path answers it. A request the lean path cannot decide, a
-- denied one included, goes the general way: the lean path has then
-- written and staged nothing (the hashes it read into hv stay read for the
-- call).

-- A hash that no request of the call has read yet is read with one HMGET
-- of the request's fields and its expiry (HASH_EXPIRY), and written at once
-- with one HSET (and PEXPIRE when its expiry grows): no map of its fields
-- is built and nothing is staged. hv[key] is then HV_WRITTEN, so that a
-- later request of the call reads it again (need); a hash read already
-- (hv[key] a table) is read and staged as by the general path.
--
-- l_rule, l_val, l_exp: per item, its rule, its field's new value and
-- expiry. Per run of items on one key (j): r_key, r_first (its first item;
-- r_first[runs + 1] is n + 1), r_vals (the HMGET's reply, or false for a
-- hash read and staged). l_args: a command's arguments.
local lean
do
  local l_rule, l_val, l_exp = {}, {}, {}
  local r_key, r_first, r_vals = {}, {}, {}
  local l_args = {}

  -- lean decides the plain request whose n items start at argv[f + 1] and
  -- returns its reply, or nil for the general path.
  function lean(f, n)
    if n > 16 then
      return nil -- its counters are found with a map (parse)
    end
    local key, runs = nil, 0
    for k = 1, n do
      local kf = f + (k - 1) * PLAIN_ITEM_FIELDS
      local arg = argv[kf + ITEM_RULE]
      local r = rules[arg] or rule_of(arg)
      if not r.lean then
        return nil
      end
      local kk = argv[kf + ITEM_KEY]
      if kk ~= SAME_KEY and kk ~= key then
        key = kk
        for j = 1, runs do
          if r_key[j] == key then
            return nil -- a key in two runs: the general path
          end
        end
        runs = runs + 1
        r_key[runs], r_first[runs] = key, k
      else
        local id = r.id
        for j = r_first[runs], k - 1 do
          if l_rule[j].id == id then
            return nil -- a counter twice: the general path
          end
        end
      end
      l_rule[k] = r
    end
    r_first[runs + 1] = n + 1
    -- the hashes read
    nk = 0
    for j = 1, runs do
      key = r_key[j]
      local h = hv[key]
      if h == nil then
        local m = 0
        for k = r_first[j], r_first[j + 1] - 1 do
          m = m + 1
          l_args[m] = l_rule[k].id
        end
        l_args[m + 1] = HASH_EXPIRY
        r_vals[j] = call('HMGET', key, unpack(l_args, 1, m + 1))
      else
        need(key)
        r_vals[j] = false
      end
    end
    if nk > 0 then
      read_hashes()
    end
    -- judged: each item's next value, or nil for the general path
    for j = 1, runs do
      local vals, k0 = r_vals[j], r_first[j]
      local h = not vals and hv[r_key[j]]
      for k = k0, r_first[j + 1] - 1 do
        local r = l_rule[k]
        local v
        if vals then
          v = vals[k - k0 + 1]
        else
          v = h[r.id] or false
        end
        local nv, x = r.impl.lean(v, r)
        if not nv then
          return nil
        end
        l_val[k], l_exp[k] = nv, x
      end
    end
    -- admitted: written
    for j = 1, runs do
      local vals, k0, k1 = r_vals[j], r_first[j], r_first[j + 1] - 1
      key = r_key[j]
      if vals then
        local m, top = 0, 0
        for k = k0, k1 do
          l_args[m + 1], l_args[m + 2] = l_rule[k].id, l_val[k]
          m = m + 2
          if l_exp[k] > top then
            top = l_exp[k]
          end
        end
        local grows = top > number_read(vals[k1 - k0 + 2])
        if grows then
          l_args[m + 1], l_args[m + 2] = HASH_EXPIRY, spack(STATE_NUMBER, top)
          m = m + 2
        end
        call('HSET', key, unpack(l_args, 1, m))
        if grows then
          call('PEXPIRE', key, ttl_ms(top, now))
        end
        hv[key] = HV_WRITTEN
      else
        for k = k0, k1 do
          stage(key, l_rule[k].id, l_val[k], l_exp[k])
        end
      end
    end
    return { VERDICT_ADMITTED_STATES, now, unpack(l_val, 1, n) }
  end
end
