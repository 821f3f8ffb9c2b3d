-- decide/state.lua: the state of the decide function, which its phases
-- (decide/*.lua), the algorithms (alg/*.lua) and the penalties
-- (penalty.lua) share.
--
-- The decide function judges every limit of one request at one instant
-- and consumes all of them or none. It is engine.Evaluate
-- (internal/engine/evaluate.go) over the algorithms of internal/engine
-- (engine/<name>.go here alg/<name>.lua), phase for phase and with the
-- same arithmetic: integers stay below 2^53 (exact in Lua numbers), and
-- the sliding window's float estimate uses the same IEEE-754 operations in
-- the same order. A differential test holds the two to identical answers.
--
-- One call (FCALL of decide_entry) decides several requests, one after the
-- other, each whole: the store sends the requests that arrive together in
-- one call, so that its fixed cost (the call, TIME, its tables) is paid once
-- per batch rather than once per request.
--
-- keys[1]: a key of the node (cluster routing only; every key is in args).
-- args and the reply: see the wire contract in prelude.lua.
--
-- The function runs on every request, so it is written for the Lua
-- interpreter: items and counters live in arrays indexed by position (no
-- table per item) that every request of the call reuses.

local argv -- the call's arguments
local now -- the current request's instant (the decision's, engine.Evaluate's now)

-- Items (index k): ctr = its counter's index; ok, retry = the judging
-- pass's verdict. An override may share a counter with a configured limit,
-- so limit and burst are the item's, not the counter's.
local n
local i_ctr, i_hits, i_refund, i_shadow, i_group, i_ok, i_retry, i_cd, i_denied = {}, {}, {}, {}, {}, {}, {}, {}, {}
local i_lim, i_burst = {}, {}
-- i_before[k]: a denied count-denied item's remaining just before its
-- charge (set by charge_denied, read by statuses)
local i_before = {}
local plain -- the request's items have no flags and no group (parse)

-- Counters (index c), each located and loaded once per request: key (its
-- hash: the descriptor's key), id (its field: the rule's ID), w (its
-- rule's window in µs; false for a calendar window), impl (its algorithm,
-- below), t (the counter's instant: now, or later when its state has seen
-- later instants, see engine/algorithm.go). The state each algorithm
-- counts with is in arrays of its own file, by the same index.
local c_key, c_id, c_w, c_impl, c_t = {}, {}, {}, {}, {}
local nc
local by_counter -- a request of many items: counter index by key and id (see parse)
-- hashed: every counter of the request has status_from_field (parse): an
-- admission of plain items then answers VERDICT_ADMITTED_STATES
local hashed

-- Reservations (decide/reserve.lua): holding says that the request has an
-- item whose rule reserves (parse), reserving that it has reservation
-- calls (its items carry ids: RESERVING_ITEMS). i_spec[k]: item k's
-- rule's reserve ({estimate, ttl}) or false; c_hold[c]: the reserve of
-- the first such item on counter c, or false; c_held[c]: the hits its
-- reservations hold (loaded for the counters with c_hold), which its
-- algorithm counts in its state as hits taken.
local holding, reserving
local i_spec, c_hold, c_held = {}, {}, {}

-- never is what retry_at returns for hits that no instant admits (engine's
-- never, Result.Never): more than the limit, or the bucket, holds.
local never = {}

-- The algorithms by code (engine.Algorithms): alg/<name>.lua registers
-- its own as algorithms[ALG_<NAME>]. An algorithm is a table of functions
-- of a counter c, as the engine's algorithm interface, judging at the
-- counter's instant c_t[c]:
--   locate(c, r): at parse, where c's state lives for rule r (the rule's
--     table, see rule_of): need_hash (a field of the descriptor's hash,
--     read by load with the hash's other fields) or its own reads;
--   load(c): c's state as stored, normalized (engine's normalize), and
--     c_t[c];
--   admits(c, hits, limit, burst), consume(c, hits, limit),
--   give_back(c, hits, limit), remaining(c, limit, burst), reset_at(c),
--   retry_at(c, hits, limit, burst) (never for no instant);
--   restore(c): back to the state as loaded (the judging pass undone);
--   write(c, undo): stages (hashes.lua) or writes what changed, and
--     appends to undo (when not nil) the operations that give it back;
--   hold(c, hits, limit), unhold(c, hits, limit): a reserve's hits taken,
--     a hold's given back (engine's hold and unhold); carry(c, held): the
--     hits held counted in the state as loaded (a window's new count starts
--     with them, a log's count has them beside its entries); rebase(c):
--     the state now is the state as loaded (a hold that ended by itself,
--     swept at load, is normalization, not the request's); only for the
--     algorithms that can hold;
--   undo: the release function's operations its writes log (UNDO_*), each
--     f(args, i, now), which undoes the one at args[i] and returns where
--     the next starts; finish_undo(), if any, runs after them;
--   lean(v, r), if any: the whole decision of one plain hit on the field
--     value v for rule r, for the lean path (decide/lean.lua), which
--     differential tests hold to the same answers as the general path;
--   status_from_field: its status follows from its hash field alone (the
--     store computes it with engine.Rule.Status from the field, which
--     parseStates in wire.go unpacks: VERDICT_ADMITTED_STATES).
local algorithms = {}
