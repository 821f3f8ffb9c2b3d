package grpcserver

import (
	"os"
	"runtime/debug"
)

// gcPercent is the GOGC rls runs with unless GOGC is set: a request leaves
// only garbage behind, and with Go's default of 100 and a small live heap the
// collector ran every few thousand requests (13% of the CPU under load).
const gcPercent = 400

// TuneGC sets the garbage collector for a server whose long-lived heap is
// bounded by heapBound bytes (the memory store's bound, or 0): GOGC 400, and
// a soft memory limit of twice the bound plus 256 MiB so that a large live
// heap does not grow to five times its size. GOGC and GOMEMLIMIT in the
// environment win. It returns what it set, for the log.
func TuneGC(heapBound int64) (gcPercentSet int, memLimit int64) {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(gcPercent)
		gcPercentSet = gcPercent
	}
	if _, ok := os.LookupEnv("GOMEMLIMIT"); !ok {
		memLimit = 2*heapBound + 256<<20
		debug.SetMemoryLimit(memLimit)
	}
	return gcPercentSet, memLimit
}
