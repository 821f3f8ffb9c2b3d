-- decide/load.lua: the second phase of a request, its counters' states
-- loaded.

-- load reads the hashes gathered by parse and each counter's state (its
-- algorithm's load, its penalty's, its reservations').
local function load()
  read_hashes()
  for c = 1, nc do
    c_impl[c].load(c)
    if c_pen[c] then
      penalty_load(c)
    end
  end
  if holding then
    for c = 1, nc do
      if c_hold[c] then
        holds.load(c)
      end
    end
  end
end
