// Package redisconn is rls's Redis driver: it calls one function of a
// Redis Functions library on a Redis (7.0 or newer), a Redis Cluster's
// masters or the master that Redis Sentinel names, for callers that must
// know what each call did. Connections are set up before a call's
// deadline runs, checked before each use and set up again in the
// background (links.go); concurrent calls share round trips and function
// calls (batch.go), each stamped with a deadline in its node's clock
// (clock.go), sent again when Redis refused it as late while its caller
// still waits, and never retried when it may have run; a cluster's
// redirections are followed (cluster.go) and Sentinel's master through
// its failovers (sentinel.go).
//
// It knows nothing of rate limiting: what a request carries and what its
// reply says are its caller's (Request), and the outcomes its caller did
// not hear (a reply after the caller stopped waiting, a call that may have
// run with no reply) are told to it (Options.OnLate, OnIndeterminate).
package redisconn
