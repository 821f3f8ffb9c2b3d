// Package proctest runs the programs that tests and benchmarks start as
// child processes (rls itself, redis-server, nginx, Prometheus) one way:
// each in its own process group, on 127.0.0.1, its output kept for failure
// messages, every wait bounded, and every process stopped by whoever
// started it (a test's Cleanup, or the benchmark's own Stop). It draws free
// loopback ports, and builds the rls binary once per state of the sources,
// shared by every test package of a run and by the benchmarks (RLS).
//
// It imports nothing but the standard library, so that deploy/ (a Go module
// of its own) can use it without carrying rls's dependencies; it knows no
// protocol beyond a TCP dial, an HTTP GET, Redis's PING and the Prometheus
// text format. It is for tests and benchmarks only: no production package
// may import it (internal/layering checks that).
package proctest
