// Package compat is envoyproxy/ratelimit's compatibility mode, at the edge
// of rls: what that server's users rely on and rls's own mode does not do —
// its environment (FromEnv: one table of the variables it reads, ignores
// and refuses, into a daemon.Config), its per-limit stats (Stats, a
// service.Observer, and its StatsD and DogStatsD sinks, a task that sends
// them on an interval), its answer rules (Answers: SHADOW_MODE, its limit
// headers, dynamic metadata; a service.AnswerRule), its config grammar
// (ParseOptions: merged domains, keys tolerated at any level; FromXDS:
// RateLimitConfig resources over xDS), its config sources (the runtime
// directory, an xDS client) and its debug and Prometheus listeners. It is a
// front end of internal/daemon and plugs into the server's, the service's
// and the config's hooks; nothing in the core or the server imports it.
package compat
