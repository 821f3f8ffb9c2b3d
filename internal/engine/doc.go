// Package engine decides rate limits. It owns the compiled rule model: a
// config's limits compile into Rules (Compile), which are all that stores
// see. It holds the algorithms, one file each, as pure functions of
// (state, now, rule, hits) behind the small algorithm interface; the
// all-or-nothing rule (Admit) that turns the verdicts on every limit of a
// request into one decision, and Evaluate, which applies both in memory;
// the key layout of counters (key.go); reservations, hits a counter
// holds for one request until it settles (reservation.go, a grant of
// package grant held by the store); and the Store interface that the
// memory and Redis stores implement.
//
// It knows nothing about config files, Redis, gRPC or HTTP: configs compile
// into it, stores call into it, and the service calls stores through it.
//
// # Adding an algorithm
//
// An algorithm is a file in each place that counts, and a timeline; no
// code outside the engine tests a rule's algorithm by its name.
//
//  1. engine/<name>.go: the algorithm's type implementing algorithm (its
//     name and code; what it checks of a Spec; what its State fields mean;
//     judge, consume, give back, remaining, reset, retry and expiry
//     instants; its answers to Rule's questions, such as Refills,
//     InFlight, WindowInIdentity and OwnKey, which are what code outside
//     the engine asks of a rule instead of its algorithm's name), and its
//     line in algorithms (algorithm.go), whose index is its code.
//  2. internal/redisstore/scripts/alg/<name>.lua: the same functions in
//     Lua, with the same arithmetic (the interface is described in
//     scripts/decide/state.lua: plus locate, load, restore and write, where
//     its state lives, a field of the descriptor's hash or a key of its
//     own, and how it is packed; and its undo table, the operations its
//     writes log, which release.lua hands back to it), the state it counts
//     with in arrays of its own, its code (local ALG_<NAME>) and its
//     registration (algorithms[ALG_<NAME>]). The store assembles the file
//     into its library by the engine's registry; TestWireContract checks
//     the file, its code and that no other file names that code.
//  3. engine/storetest: a timeline in timelines, which the reference store,
//     memstore and redisstore (single node and cluster) then all run; the
//     differential tests pick up the new algorithm from the names they draw.
package engine

// The IANA time zone database is embedded, so that calendar rules compile
// on machines (and distroless images) without /usr/share/zoneinfo.
import _ "time/tzdata"
