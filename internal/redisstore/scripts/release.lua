-- release.lua: undoes what a decision wrote, from the undo log that the
-- decide function returned with it: the reservation of one cluster node (or
-- store) when the request, spread over several, turned out to be denied
-- elsewhere, or a late decision whose caller stopped waiting. Every
-- operation is a delta, so consumption by other requests since stays
-- counted. Each operation is undone by the algorithm that wrote it (its
-- undo table, in alg/<name>.lua); this file only dispatches.
--
-- keys[1]: a key of the node (routing only).
-- args: the instant in microseconds or "" (see the test seam in
-- prelude.lua), then operations as the decide function logged them (UNDO_* of the
-- prelude, each followed by its key and fields), then UNDO_PUBLISH base for
-- each counter whose hits are given back: published on <prefix>freed after
-- the others, so that other processes drop their cached denials of it.

-- undoers maps each operation to the function of the algorithm that undoes
-- it: f(args, i, now) undoes the operation at args[i] and returns where the
-- next one starts. Made at the first release (the library's top level runs
-- before Redis gives it pairs).
local undoers

local function undoer(op)
  if not undoers then
    undoers = {}
    for _, alg in pairs(algorithms) do
      for o, f in pairs(alg.undo) do
        undoers[o] = f
      end
    end
    for o, f in pairs(holds.undo) do -- a counter's reservations (decide/reserve.lua)
      undoers[o] = f
    end
  end
  return undoers[op]
end

-- release_entry is the FCALL entry point.
local function release_entry(_, args)
  bind()
  time_now = nil
  local now = clock(args[1])
  local i = 2
  while i <= #args do
    local op = args[i]
    if op == UNDO_PUBLISH then
      freed(args[i + 1])
      i = i + 2
    elseif undoer(op) then
      i = undoer(op)(args, i, now)
    else
      return redis.error_reply('rls: unknown release operation ' .. tostring(op))
    end
  end
  for _, alg in pairs(algorithms) do
    if alg.finish_undo then
      alg.finish_undo()
    end
  end
  return 1
end
