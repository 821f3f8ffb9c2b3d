// Package compat is envoyproxy/ratelimit's compatibility mode, at the edge
// of rls: what that server's users rely on and rls's own mode does not do —
// its per-limit stats (Stats, a service.Observer), its answer rules
// (Answers: SHADOW_MODE, its limit headers, dynamic metadata; a
// service.AnswerRule), and its config grammar (ParseOptions: merged
// domains, keys tolerated at any level; FromXDS: RateLimitConfig resources
// over xDS). It plugs into the service's and the config's hooks; nothing
// in the core imports it.
package compat
