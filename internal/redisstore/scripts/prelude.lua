-- prelude.lua: what every file of the scripts shares. The scripts make one
-- Redis Functions library (see library in wire.go), assembled from their
-- files in this order: this prelude; the decide function's state
-- (decide/state.lua, decide/hashes.lua); the algorithms, one file each
-- (alg/<name>.lua, by code); the penalties (penalty.lua); the decide
-- function's phases (decide/parse.lua ... decide/decide.lua, with its lean
-- path for plain requests, decide/lean.lua); the release
-- function (release.lua). The library is one chunk: a file sees the locals
-- of the files before it (as upvalues, as fast as its own), and a file
-- keeps what no later file needs in a block of its own (do ... end), so
-- that the chunk stays within Lua's 200 locals. Loaded once per node with
-- FUNCTION LOAD, its top level runs once, and each request is an FCALL of
-- an entry point (decide_entry, release_entry), which creates no closures.
-- A script sent with EVALSHA would create all of its functions again at
-- every call.
--
-- The wire contract is named once on each side: these constants here, the
-- same names in internal/redisstore/wire.go, and TestWireContract fails
-- when the two differ. The algorithm codes (ALG_<NAME>) are each in its
-- algorithm's file.

-- The key layout's parts the scripts derive (engine/key.go): the counters
-- of a descriptor (but sliding logs) are the fields of one hash, named by
-- their rule IDs, and its field HASH_EXPIRY holds the instant at which the
-- hash expires; a sliding log is a sorted set at the hash's key, ':' and
-- its rule ID (the counter's key, engine.CounterKey). Notices go to the
-- channel of a key's prefix (what precedes its hash tag) and FREED_CHANNEL.
local HASH_EXPIRY = 'x'
-- A penalized counter's strikes and block end are the field of its rule ID
-- and PENALTY_SUFFIX (engine.PenaltyField), in the same hash (a sliding
-- log's too): the block end and strikes (see penalty.lua).
local PENALTY_SUFFIX = '!p'
-- A counter whose limit reserves keeps its reservations in a field of the
-- hash and two keys beside it: see decide/reserve.lua, which names those
-- parts of the key layout, and its part of the wire contract (the reply's
-- reservation fields, its undo operation), in its block.
local FREED_CHANNEL = 'freed'

-- The decide function's arguments: args[1] is the number of requests, then each
-- request is REQUEST_HEAD fields at the REQUEST_* positions, followed by
-- ITEM_FIELDS fields per item at the ITEM_* positions, or, for a request
-- whose items all take one hit with no flags and no group (REQUEST_ITEMS
-- negative), PLAIN_ITEM_FIELDS: ITEM_KEY and ITEM_RULE.
local REQUEST_HEAD = 4
local REQUEST_MODE = 1 -- MODE_*
local REQUEST_INSTANT = 2 -- µs, or "" for Redis TIME
-- "" for none, or two numbers packed as DEADLINE_PACK (one C call to read,
-- where decimal text took two tonumber): the µs of Redis's clock after
-- which the request is not decided, and those after which the reply
-- carries its undo log
local REQUEST_DEADLINE = 3
local DEADLINE_PACK = '<dd'
local REQUEST_ITEMS = 4 -- the number of items; minus it for plain items;
                        -- RESERVING_ITEMS and it for items with a reservation id
local RESERVING_ITEMS = 'r'
-- A request with reservation calls sends RESERVING_ITEM_FIELDS per item:
-- ITEM_FIELDS and ITEM_RESERVATION, the reservation's id ('' for none).
local RESERVING_ITEM_FIELDS = 5
local ITEM_RESERVATION = 5
local ITEM_FIELDS = 4
local PLAIN_ITEM_FIELDS = 2
local ITEM_KEY = 1 -- the descriptor's key (engine.DescriptorKey): its counters' hash;
                   -- SAME_KEY for the previous item's
local SAME_KEY = ''
-- the rule: RULE_PATTERN's fields, 'code|window|limit|burst|penalty|reserve|id':
-- its algorithm, its window in µs (a calendar window's: see
-- alg/calendar_window.lua), its limit and burst, its penalty ('' for none,
-- else 'reset:step:step...' in µs, engine.Rule.PenaltyArg), its reserve
-- ('' for none, else 'estimate:ttl' in µs, engine.Rule.ReserveArg) and its
-- ID (the counter's field in the hash).
-- Parsed once per library load and kept (a calendar window's changes with
-- its bounds).
local ITEM_RULE = 2
local RULE_PATTERN = '^(%d+)|([%d:]+)|(%d+)|(%d+)|([%d:]*)|([%d:]*)|(.*)$'
local ITEM_HITS = 3
-- sum of FLAG_* and OPTS_GROUP times the quota group (0 for none; in
-- MODE_RESERVE, -g for a group g that another node found over: judged,
-- not consumed; regroup in reserve.go)
local ITEM_OPTS = 4
local OPTS_GROUP = 16
local FLAG_REFUND = 1
local FLAG_SHADOW = 2
local FLAG_COUNT_DENIED = 4
local FLAG_DENIED = 8 -- MODE_CHARGE: the item was judged denied

-- Modes: the whole request; this node's part of a request spread over
-- cluster nodes (reserve).
local MODE_FINAL = 'F'
local MODE_RESERVE = 'R'
-- After a cluster node's reservation was released: charge the count-denied
-- items (hits that count whether or not admitted) as the denied request
-- would have, with the verdicts it had (FLAG_DENIED), and read the statuses.
local MODE_CHARGE = 'C'
-- A dry run (engine.Peek): judge the request and consume nothing (only
-- what normalization changes is written, as by any decision); the statuses
-- give each limit's remaining and reset before the request.
local MODE_PEEK = 'P'

-- The decide function's reply, per request: REPLY_HEAD fields (the
-- verdict, one of VERDICT_*, and the instant), then, unless expired,
-- REPLY_ITEM_FIELDS per item (its verdict, see REPLY_ITEM_*; remaining,
-- reset µs, retry µs or RETRY_NEVER); then the undo log (operations for
-- release.lua) in MODE_RESERVE when admitted, and in the other modes when the request was decided after its undo instant
-- (REQUEST_DEADLINE); then, in MODE_RESERVE when admitted, per item the remaining and
-- reset µs of the state before the request.
-- A request admitted in MODE_FINAL without flags, groups, penalties or an
-- undo log, whose counters all keep their state in its descriptor's hash
-- (fixed and sliding windows, token buckets), is answered
-- VERDICT_ADMITTED_STATES instead: after the head, per item its counter's
-- field as the decision left it (false: none), from which the store
-- computes the statuses (engine.Rule.Status), sparing Redis that work.
local REPLY_HEAD = 2
local REPLY_ITEM_FIELDS = 4
local VERDICT_DENIED = 0
local VERDICT_ADMITTED = 1
local VERDICT_EXPIRED = 2 -- past its deadline: nothing decided, nothing consumed
local VERDICT_ADMITTED_STATES = 3
local RETRY_NEVER = -1 -- an item's retry when no wait admits its hits (engine.Result.Never)
-- An item's verdict: admitted, denied, or denied with its hits charged all
-- the same (FLAG_COUNT_DENIED): then REPLY_ITEM_CHARGED minus what remained
-- just before the charge (engine.Result.RemainingBeforeCharge), so that
-- only those items pay for it, and with no field more.
local REPLY_ITEM_DENIED = 0
local REPLY_ITEM_ADMITTED = 1
local REPLY_ITEM_CHARGED = -1
-- denied by the block a penalty put on its counter (engine.Result.Blocked),
-- and so with its hits charged (nothing remained before the charge)
local REPLY_ITEM_BLOCKED = 2
local REPLY_ITEM_BLOCKED_CHARGED = 3
-- An item whose rule reserves has more fields: see decide/reserve.lua
-- (REPLY_HOLD_FIELDS).

-- How far ahead of now a consumption puts a token bucket's TAT, in µs
-- (engine.MaxBucketAhead): hits that count when denied push it on without
-- end.
local TB_MAX_AHEAD = 1125899906842624

-- The release function's operations (the undo log that the decide function
-- writes; each algorithm's file undoes its own):
local UNDO_WINDOW = 'W' -- key id start window span delta: remove delta hits from the
                        -- window that started at start (or, a window later, from the previous one)
local UNDO_TAT = 'T' -- key id delta: token bucket TAT += delta µs
local UNDO_ZREM = 'Z' -- key count members...: remove log entries
local UNDO_ZADD = 'A' -- key window count (score member)...: put back log entries
local UNDO_PUBLISH = 'P' -- base: announce hits given back (see freed)
-- (and UNDO_HOLD, a counter's reservations: see decide/reserve.lua)

-- The standard functions the scripts use. A library's top level runs
-- before Redis gives it any (not even tonumber), so the entry points call
-- bind: decide_entry at its first call only (they stay bound for the
-- library's life; a library loaded again starts unbound), release_entry at
-- each.
local floor, min, max, tonumber, tostring, unpack, pairs, format, match, call, pcall_redis
local spack, sunpack
local function bind()
  floor, min, max = math.floor, math.min, math.max
  tonumber, tostring, unpack, pairs = _G.tonumber, _G.tostring, _G.unpack, _G.pairs
  format, match = string.format, string.match
  call, pcall_redis = redis.call, redis.pcall
  spack, sunpack = struct.pack, struct.unpack
end

-- exact floor(a / b) for non-negative integers below 2^53
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- The start of the window of length w that holds the instant now is
-- now - now % w (the algorithms' files write it inline: a call of idiv
-- and floor per counter cost 3 % of a decision's instructions). It is
-- exact whenever now + w < 2^53, as an instant in µs of this century and
-- a window of at most 100 years (engine.MaxWindow) are: Lua's a % b is
-- a - floor(a / b) * b, and the quotient a / b, correctly rounded, reaches
-- the next integer above it (at least 1/b away) only when that integer
-- times b is 2^53 or more.

-- an integer below 2^53 as Redis arguments want it (no exponent)
local function fmt(x)
  return format('%.0f', x)
end



---------------------------------------------------------------------------
-- The clock, and the scripts' one test seam. A request's instant argument
-- (REQUEST_INSTANT; release's first) is "" in production: the scripts
-- decide at Redis TIME, read once per call. A store on a test clock
-- (redisstore's Options.Now, for tests only) passes its reading in µs
-- instead. Expiries are relative (PX, PEXPIRE), and Redis expires keys on
-- its own clock: a machine slow between two steps of a test clock would
-- lose a state the steps still need, so with a test clock every expiry is
-- padded by a day (ttl_pad). Expiry only collects garbage: a state past its
-- expiry reads as no state, and a touch deletes it.

local test_clock_pad_ms = 86400000 -- not part of the wire contract
local ttl_pad = 0
local time_now -- Redis TIME in µs, read once per call (each entry point clears it)

-- clock returns the instant of an instant argument in µs (Redis TIME for
-- ""), and sets ttl_pad for it.
local function clock(arg)
  if arg ~= '' then
    ttl_pad = test_clock_pad_ms
    return tonumber(arg)
  end
  ttl_pad = 0
  if not time_now then
    local t = call('TIME')
    time_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return time_now
end

-- ttl_ms returns the milliseconds from now to the instant us (at least 1),
-- plus ttl_pad.
local function ttl_ms(us, now)
  return fmt(max(1, idiv(us - now + 999, 1000)) + ttl_pad)
end

---------------------------------------------------------------------------

-- freed announces that hits of the counter base were given back, on the
-- channel <prefix>freed: other rls processes drop their cached denials of
-- that counter (the prefix is what precedes the hash tag). pcall: an account
-- without the channel's permission must not fail the script halfway through
-- its writes (their caches then stay off, see freed.go).
local function freed(base)
  pcall_redis('PUBLISH', match(base, '^[^{]*') .. FREED_CHANNEL, base)
end

-- A counter's state in its hash field: its numbers (integers below 2^53)
-- packed as little-endian doubles (STATE_NUMBER each; Go's
-- math.Float64frombits reads them), as its algorithm's file says (a window
-- counter holds its window's start in µs and count, a token bucket its
-- TAT). Packing and unpacking are one C call, where decimal text cost a
-- format and a tonumber per number. HASH_EXPIRY holds one number.
local STATE_NUMBER = '<d'

-- a number of a state (a TAT, the hash's expiry) from its packed value, 0
-- for none
local function number_read(v)
  if not v then
    return 0
  end
  local x = sunpack(STATE_NUMBER, v)
  return x
end

-- set_field writes field id of the hash key at once (release.lua's
-- undo), and makes the hash live at least until expires; a false value
-- deletes the field.
local function set_field(key, id, value, expires, now)
  if not value then
    call('HDEL', key, id)
    return
  end
  call('HSET', key, id, value)
  if expires > number_read(call('HGET', key, HASH_EXPIRY)) then
    call('HSET', key, HASH_EXPIRY, spack(STATE_NUMBER, expires))
    call('PEXPIRE', key, ttl_ms(expires, now))
  end
end

-- the key of counter id of the hash key: a sliding log's, and what freed
-- announces (engine.CounterKey)
local function counter_key(key, id)
  return key .. ':' .. id
end

-- The member of a sliding log's sorted set whose score is minus one minus
-- the hits of its entries (see alg/sliding_log.lua).
local LOG_TOTAL = 'n'
