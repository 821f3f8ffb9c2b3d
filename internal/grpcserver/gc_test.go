package grpcserver

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestTuneGC: each setting is made unless the environment made it.
func TestTuneGC(t *testing.T) {
	percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
	for _, tc := range []struct {
		env         EnvGC
		wantPercent int   // what GOGC reads afterwards
		wantLimit   int64 // what the memory limit reads afterwards
	}{
		{EnvGC{}, 400, 2<<20 + 256<<20},
		{EnvGC{GOGC: true}, 100, 2<<20 + 256<<20},
		{EnvGC{GOMEMLIMIT: true}, 400, math.MaxInt64},
		{EnvGC{GOGC: true, GOMEMLIMIT: true}, 100, math.MaxInt64},
	} {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
		gotPercent, gotLimit := TuneGC(1<<20, tc.env)
		if p := debug.SetGCPercent(100); p != tc.wantPercent {
			t.Errorf("TuneGC(1 MiB, %+v): GOGC %d, want %d", tc.env, p, tc.wantPercent)
		}
		if l := debug.SetMemoryLimit(-1); l != tc.wantLimit {
			t.Errorf("TuneGC(1 MiB, %+v): memory limit %d, want %d", tc.env, l, tc.wantLimit)
		}
		if (gotPercent != 0) == tc.env.GOGC || (gotLimit != 0) == tc.env.GOMEMLIMIT {
			t.Errorf("TuneGC(1 MiB, %+v) = %d, %d; want 0 for what the environment set", tc.env, gotPercent, gotLimit)
		}
	}
}
