// Package redisstore is the engine.Store on Redis (7.0 or newer), Redis
// Cluster or a master that Redis Sentinel watches, optionally with a second
// Redis for the windows shorter than a minute (Options.PerSecond): one Lua
// function (scripts/decide/, in a Redis Functions library with
// release.lua and the shared prelude.lua) judges every limit of a request
// at Redis's clock and consumes all of them or none, in one FCALL per node
// the request touches. One router (router.go) splits a request over its
// backends (the store's Redis, the per-second Redis) and their nodes: on
// several nodes, each reserves its share and a denied request's shares are
// given back (reserve.go). The connections, the batching of concurrent
// requests into pipelines and shared FCALLs, the deadlines in each node's
// clock, the cluster's redirections and Sentinel's master are the Redis
// driver's (internal/redisconn), which the library is given to load on
// each node; the store gives it requests (wire.go) and reads their replies,
// and gives back what late replies consumed.
//
// A plain request (one hit per item, no flags, each counter once, no
// penalty or reserve) takes the function's lean path (decide/lean.lua):
// each algorithm's lean step judges and updates its field alone, and a
// hash is read with one HMGET and written with one HSET, without the
// general path's tables; anything else, a denial included, goes the
// general way.
//
// The scripts mirror the engine's algorithms file by file (scripts/alg/);
// the wire contract between Go and Lua (argument and reply layouts, codes)
// is named once on each side, in wire.go and scripts/prelude.lua.
// Denials whose end Redis computed are answered from memory until then, or
// until Redis announces on <prefix>freed that hits of that counter were
// given back (a refund, a released cluster reservation). It knows nothing
// about transports.
//
// # Key layout
//
// Every key starts with the prefix (--redis-prefix, default "rls:"), then
// the descriptor's identity in braces (engine.DescriptorKey). The counters
// of a descriptor are the fields of one hash at that key, each named by its
// limit's ID, but for sliding logs and concurrency limits, each a sorted
// set at the hash's key, ":" and its limit's ID (engine.CounterKey):
//
//	rls:{api/remote_address=203.0.113.7}   hash: fw60s, sw3600s, tb1s, cal.month@UTC: each its state; x: the hash's expiry
//	rls:{api/user=u1}:sl60s:5:burst        sliding_log: a sorted set of admitted hits (score µs)
//	rls:{uploads/tenant=acme}:cc           concurrency: a sorted set of the acquisitions held (score µs)
//
// A state is its numbers packed as little-endian float64s (exact below
// 2^53): a fixed or calendar window's start (µs) and count, a sliding
// window's start, count and previous window's count, a token bucket's TAT
// (µs). The identity (engine.AppendDescriptorKey) is the domain, then
// "/key=value" per entry, with '%', '/', '=', '~', '#', '{', '}', ':' and
// bytes outside printable ASCII percent-escaped and parts longer than 64
// bytes replaced by "#" and a SHA-256 prefix, so keys are unambiguous and
// bounded, and the braces make the identity Redis Cluster's hash tag: all
// counters of one descriptor live in one slot. The limit ID is the
// algorithm, the window in seconds and, for a named limit, ":" + the name's
// length + ":" + the name.
//
// A state weighs until its own expiry (a window's end, the next window's
// for a sliding window, a TAT's instant): past it, it reads as no state,
// and a touch deletes it. The hash expires at the latest of its states'
// expiries (its field x, PEXPIRE only when that grows); a sliding log
// expires a window after its newest hit.
package redisstore
