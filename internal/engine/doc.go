// Package engine decides rate limits. It owns the compiled rule model: a
// config's limits compile into Rules (Compile), which are all that stores
// see. It holds the algorithms, one file each, as pure functions of
// (state, now, rule, hits) behind the small algorithm interface; the
// all-or-nothing rule (Admit) that turns the verdicts on every limit of a
// request into one decision, and Evaluate, which applies both in memory;
// the key layout of counters (key.go); and the Store interface that the
// memory and Redis stores implement.
//
// It knows nothing about config files, Redis, gRPC or HTTP: configs compile
// into it, stores call into it, and the service calls stores through it.
//
// # Adding an algorithm
//
//  1. engine: a file with the algorithm's type implementing algorithm (its
//     name and code; what it checks of a Spec; what its State fields mean;
//     judge, consume, give back, remaining, reset, retry and expiry
//     instants; its answers to Rule's questions), and its line in
//     algorithms (algorithm.go), whose index is its code.
//  2. redisstore: a section in scripts/decide.lua mirroring the Go file
//     function for function (plus locate, load and write: where its state
//     lives, a field of the descriptor's hash or a key of its own, and how
//     it is packed; and its undo table: the operations its writes log,
//     which release.lua hands back to it), its code in scripts/prelude.lua
//     (ALG_<NAME>) and its line in decide.lua's algorithms table.
//     TestWireContract checks both against the engine's registry.
//  3. engine/storetest: a timeline in timelines, which the reference store,
//     memstore and redisstore (single node and cluster) then all run; the
//     differential tests pick up the new algorithm from the names they draw.
package engine

// The IANA time zone database is embedded, so that calendar rules compile
// on machines (and distroless images) without /usr/share/zoneinfo.
import _ "time/tzdata"
