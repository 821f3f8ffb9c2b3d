package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// TestDeterministic: the same seed gives the same figures, whatever the
// number of workers.
func TestDeterministic(t *testing.T) {
	opts := defaultOptions()
	opts.Requests = 50_000
	var one, two bytes.Buffer
	opts.Workers = 1
	run(opts).write(&one)
	opts.Workers = 3
	run(opts).write(&two)
	if one.String() != two.String() {
		t.Errorf("1 worker:\n%s\n3 workers:\n%s", one.String(), two.String())
	}
}

// TestInvariants: what must hold whatever the trace: the sliding log never
// admits more than its limit in a window; a fixed window never counts more
// than the exact window (its window is inside it), so it never denies
// wrongly when every request counts; and the boundary scenario reaches the
// known worst cases (2× for a fixed window; near 2× for the sliding
// window's estimate, which assumes the previous window's hits were spread
// evenly).
func TestInvariants(t *testing.T) {
	opts := defaultOptions()
	opts.Requests = 100_000
	rep := run(opts)
	if rep.requests < opts.Requests || rep.logWorst > 1 {
		t.Errorf("%d requests (want ≥ %d); sliding log's worst window %.2f×, want ≤ 1", rep.requests, opts.Requests, rep.logWorst)
	}
	fixed, sliding := rep.tallies[1], rep.tallies[0]
	if fixed.wronglyDenied != 0 || fixed.wronglyAllowed == 0 {
		t.Errorf("fixed_window, every request counting: %d wrongly denied (want 0), %d wrongly allowed (want some)", fixed.wronglyDenied, fixed.wronglyAllowed)
	}
	if sliding.wronglyAllowed+sliding.wronglyDenied >= fixed.wronglyAllowed {
		t.Errorf("sliding_window wrong %d times, fixed_window %d: the estimate should be far closer", sliding.wronglyAllowed+sliding.wronglyDenied, fixed.wronglyAllowed)
	}
	if b := boundaryCase(engine.FixedWindow, 10, time.Minute); b.most != 20 {
		t.Errorf("fixed_window boundary: %d admitted in a window of 10 per minute, want 20", b.most)
	}
	if b := boundaryCase(engine.SlidingWindow, 4, 4*time.Second); b.most != 7 {
		t.Errorf("sliding_window boundary, 4 per 4 s: %d admitted in a window, want 7", b.most)
	}
	if b := boundaryCase(engine.SlidingLog, 200, time.Second); b.most != 200 {
		t.Errorf("sliding_log boundary, 200 per second: %d admitted in a window, want 200", b.most)
	}
}
