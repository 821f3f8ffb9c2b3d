-- decide/hashes.lua: the descriptors' hashes, read once and written once
-- per call.
--
-- hv[key] is the fields that the requests decided so far left (a field
-- absent: no state), hx[key] the instant at which the hash expires (0:
-- none). A request's hashes that the call has not read yet are gathered in
-- mk[1..nk] (need) and read together (read_hashes). A field a request
-- changes is staged (stage): its hash and field appended to wk, wf
-- (1..nw), and flush writes each changed hash with one HSET (and PEXPIRE
-- when its expiry grew, grew[key]): every counter of a descriptor in one
-- command. The lean path (decide/lean.lua) reads and writes a hash that the
-- call has not read yet at once, without a map of its fields.
local hv, hx, grew
local mk, nk = {}, 0
local wk, wf, nw = {}, {}, 0

-- HV_WRITTEN: hv[key] of a hash that the lean path wrote at once
-- (decide/lean.lua): read again when needed.
local HV_WRITTEN = 0

local function need(key)
  local h = hv[key]
  if h == nil or h == HV_WRITTEN then
    nk = nk + 1
    mk[nk] = key
    hv[key] = false -- gathered
  end
end

-- need_hash is the locate of a counter kept in its descriptor's hash
-- (parse calls need itself for those).
local function need_hash(c)
  need(c_key[c])
end

-- read_hashes reads the hashes gathered, each with one HGETALL.
local function read_hashes()
  for j = 1, nk do
    local key = mk[j]
    local all, t = call('HGETALL', key), {}
    for f = 1, #all, 2 do
      t[all[f]] = all[f + 1]
    end
    hv[key], hx[key] = t, number_read(t[HASH_EXPIRY])
  end
end

-- stage sets field id of hash key to value, a state that expires at
-- expires, or deletes the field when value is false (a state equivalent to
-- none, which a touch forgets, as memstore forgets it: a stale state would
-- read as its old self again if the clock stepped back).
local function stage(key, id, value, expires)
  hv[key][id] = value
  nw = nw + 1
  wk[nw], wf[nw] = key, id
  if value and expires > hx[key] then
    hx[key] = expires
    grew[key] = true
  end
end

-- flush writes what the call staged: per hash, one HSET of the fields set
-- and one HDEL of those deleted, at the hash's first staged field (the
-- fields a later request staged in it are gathered from there). Expiries
-- are relative to the last request's instant: the hash's is an instant of
-- that clock.
local fv, dv = {}, {}
local function flush()
  for j = 1, nw do
    local key = wk[j]
    if key then -- not written with an earlier entry's hash
      local t = hv[key]
      local m, ndel = 0, 0
      for i = j, nw do
        if wk[i] == key then
          wk[i] = false
          local id = wf[i]
          local v = t[id]
          if v then
            fv[m + 1], fv[m + 2] = id, v
            m = m + 2
          else
            ndel = ndel + 1
            dv[ndel] = id
          end
        end
      end
      local g = grew[key]
      if g then
        fv[m + 1], fv[m + 2] = HASH_EXPIRY, spack(STATE_NUMBER, hx[key])
        m = m + 2
      end
      if m > 0 then
        call('HSET', key, unpack(fv, 1, m))
      end
      if ndel > 0 then
        call('HDEL', key, unpack(dv, 1, ndel))
      end
      if g then
        call('PEXPIRE', key, ttl_ms(hx[key], now))
      end
    end
  end
end
