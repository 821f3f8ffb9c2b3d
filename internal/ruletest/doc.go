// Package ruletest runs test files against a limits config, as `rls test`
// does (like promtool test rules): each case is a timeline of requests on
// a virtual clock, decided by the real service on a fresh memory store
// whose clock is the case's, with the verdicts, statuses and headers each
// step expects. The format is docs/testing.md's.
//
// It parses test files (strictly: unknown keys are errors with
// file:line:col) and reports per case; it knows no transport, and starts
// no server.
package ruletest
