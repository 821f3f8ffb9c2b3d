// Package engine decides rate limits. It holds the four algorithms as pure
// functions of (state, now, limit, hits), the all-or-nothing rule that turns
// the verdicts on every limit of a request into one decision, the encoding of
// counter keys, and the Store interface that the memory and Redis stores
// implement.
//
// It knows nothing about Redis, gRPC or HTTP: stores call into it, and the
// service calls stores through it.
package engine
