package grpcserver

import "runtime/debug"

// gcPercent is the GOGC rls runs with unless GOGC is set: a request leaves
// only garbage behind, and with Go's default of 100 and a small live heap the
// collector ran every few thousand requests (13% of the CPU under load).
const gcPercent = 400

// EnvGC says which collector settings the environment made: GOGC and
// GOMEMLIMIT, which the runtime already follows. The caller reads the
// environment (cmd/rls does; nothing below it does).
type EnvGC struct {
	GOGC, GOMEMLIMIT bool
}

// TuneGC sets the garbage collector for a server whose long-lived heap is
// bounded by heapBound bytes (the memory store's bound, or 0): GOGC 400, and
// a soft memory limit of twice the bound plus 256 MiB so that a large live
// heap does not grow to five times its size. A setting that env says the
// environment made is left alone. It returns what it set (0 for what it
// left), for the log.
func TuneGC(heapBound int64, env EnvGC) (gcPercentSet int, memLimit int64) {
	if !env.GOGC {
		debug.SetGCPercent(gcPercent)
		gcPercentSet = gcPercent
	}
	if !env.GOMEMLIMIT {
		memLimit = 2*heapBound + 256<<20
		debug.SetMemoryLimit(memLimit)
	}
	return gcPercentSet, memLimit
}
