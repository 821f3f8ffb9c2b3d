// Package engine decides rate limits. It holds the algorithms, one file
// each, as pure functions of (state, now, limit, hits) behind the small
// algorithm interface; the all-or-nothing rule (Admit) that turns the
// verdicts on every limit of a request into one decision, and Evaluate,
// which applies both in memory; the encoding of counter keys; and the Store
// interface that the memory and Redis stores implement.
//
// It knows nothing about Redis, gRPC or HTTP: stores call into it, and the
// service calls stores through it.
//
// # Adding an algorithm
//
//  1. descriptors: a new Algorithm constant, its config name and its
//     counter-ID code (types.go), and its validation (limit.go).
//  2. engine: a file with the algorithm's type implementing algorithm (what
//     its State fields mean, judge, consume, give back, remaining, reset,
//     retry and expiry instants), and its entry in algorithms.
//  3. redisstore: its code in scripts/prelude.lua and wire.go (same name:
//     ALG_<CONFIG NAME>), a section in scripts/decide.lua mirroring the Go
//     file function for function (plus locate, load and write: its keys),
//     its entry in decide.lua's algorithms table, and any undo operation
//     that release.lua needs for cluster reservations.
//  4. engine/storetest: a timeline in timelines, which the reference store,
//     memstore and redisstore (single node and cluster) then all run; the
//     differential tests pick up the new algorithm from the limits they draw.
package engine
