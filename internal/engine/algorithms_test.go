package engine

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
)

// t0 is aligned to the second, the minute and the hour.
var t0 = time.Unix(1_800_000_000, 0)

func limit(alg descriptors.Algorithm, rpu uint32, window time.Duration, burst uint32) *descriptors.Limit {
	return &descriptors.Limit{
		Algorithm:       alg,
		RequestsPerUnit: rpu,
		Window:          window,
		Burst:           burst,
		ID:              fmt.Sprintf("%d:%s", alg, window),
	}
}

type step struct {
	at        time.Duration // since t0
	hits      uint64
	refund    bool
	ok        bool
	remaining uint64
	reset     time.Duration // checked when ≥ 0
	retry     time.Duration // checked when the step denies
}

func runSteps(t *testing.T, l *descriptors.Limit, steps []step) {
	t.Helper()
	var st State
	for i, s := range steps {
		v := Step(l, st, t0.Add(s.at), s.hits, s.refund)
		call := fmt.Sprintf("step %d: Step(%s %d/%s, t0+%s, hits=%d, refund=%v)", i, l.Algorithm, l.RequestsPerUnit, l.Window, s.at, s.hits, s.refund)
		if v.Admitted != s.ok {
			t.Fatalf("%s admitted = %v, want %v", call, v.Admitted, s.ok)
		}
		if v.Remaining != s.remaining {
			t.Errorf("%s remaining = %d, want %d", call, v.Remaining, s.remaining)
		}
		if s.reset >= 0 && v.Reset != s.reset {
			t.Errorf("%s reset = %s, want %s", call, v.Reset, s.reset)
		}
		if !s.ok && v.RetryAfter != s.retry {
			t.Errorf("%s retry after = %s, want %s", call, v.RetryAfter, s.retry)
		}
		if s.ok && v.RetryAfter != 0 {
			t.Errorf("%s retry after = %s on an admitted step, want 0", call, v.RetryAfter)
		}
		st = v.Next
	}
}

const sec, ms, us = time.Second, time.Millisecond, time.Microsecond

func TestFixedWindow(t *testing.T) {
	runSteps(t, limit(descriptors.FixedWindow, 3, time.Minute, 0), []step{
		{at: 0, hits: 1, ok: true, remaining: 2, reset: 60 * sec},
		{at: 1 * sec, hits: 2, ok: true, remaining: 0, reset: 59 * sec},
		{at: 2 * sec, hits: 1, ok: false, remaining: 0, reset: 58 * sec, retry: 58 * sec},
		{at: 2 * sec, hits: 0, ok: true, remaining: 0, reset: 58 * sec}, // a look at the limit is OK
		{at: 60*sec - us, hits: 1, ok: false, remaining: 0, reset: us, retry: us},
		{at: 60 * sec, hits: 1, ok: true, remaining: 2, reset: 60 * sec}, // new window
		{at: 61 * sec, hits: 4, ok: false, remaining: 2, reset: 59 * sec, retry: 59 * sec},
		{at: 62 * sec, hits: 2, ok: true, remaining: 0, reset: 58 * sec}, // the denial cost nothing
		{at: 63 * sec, hits: 2, refund: true, ok: true, remaining: 2, reset: 57 * sec},
		{at: 64 * sec, hits: 9, refund: true, ok: true, remaining: 3, reset: 56 * sec}, // never below zero
	})
}

func TestFixedWindowZeroLimit(t *testing.T) {
	runSteps(t, limit(descriptors.FixedWindow, 0, time.Second, 0), []step{
		{at: 0, hits: 1, ok: false, remaining: 0, reset: sec, retry: sec},
		{at: 0, hits: 0, ok: true, remaining: 0, reset: sec},
	})
}

func TestSlidingWindow(t *testing.T) {
	runSteps(t, limit(descriptors.SlidingWindow, 10, time.Minute, 0), []step{
		{at: -30 * sec, hits: 10, ok: true, remaining: 0, reset: 30 * sec},
		// At t0 the previous window still weighs fully: 10 of 10.
		{at: 0, hits: 1, ok: false, remaining: 0, reset: 60 * sec, retry: 6*sec - us},
		{at: 6*sec - us, hits: 1, ok: false, remaining: 0, reset: 54*sec + us, retry: us},
		// At t0+6s the previous window weighs 54/60: 9 of 10.
		{at: 6 * sec, hits: 1, ok: true, remaining: 0, reset: 54 * sec},
		// At t0+30s: 10×0.5 + 1 = 6.
		{at: 30 * sec, hits: 0, ok: true, remaining: 4, reset: 30 * sec},
		{at: 30 * sec, hits: 5, ok: false, remaining: 4, reset: 30 * sec, retry: 6*sec - us},
		{at: 30 * sec, hits: 4, ok: true, remaining: 0, reset: 30 * sec},
		// Two windows later everything is forgotten.
		{at: 120 * sec, hits: 10, ok: true, remaining: 0, reset: 60 * sec},
		{at: 121 * sec, hits: 3, refund: true, ok: true, remaining: 3, reset: 59 * sec},
	})
}

func TestSlidingWindowDeniedUntilNextWindow(t *testing.T) {
	// The current window alone is full: only the next window, where it
	// becomes the previous one and decays, can admit.
	runSteps(t, limit(descriptors.SlidingWindow, 10, time.Minute, 0), []step{
		{at: 0, hits: 10, ok: true, remaining: 0, reset: 60 * sec},
		// 10×(60-e)/60 + 5 ≤ 10 from e = 30s of the next window.
		{at: 10 * sec, hits: 5, ok: false, remaining: 0, reset: 50 * sec, retry: 80*sec - us},
		{at: 90 * sec, hits: 5, ok: true, remaining: 0, reset: 30 * sec},
		{at: 91 * sec, hits: 11, ok: false, remaining: 0, reset: 29 * sec, retry: 29 * sec},
	})
}

func TestSlidingLog(t *testing.T) {
	runSteps(t, limit(descriptors.SlidingLog, 3, time.Minute, 0), []step{
		{at: 0, hits: 1, ok: true, remaining: 2, reset: 60 * sec},
		{at: 10 * sec, hits: 1, ok: true, remaining: 1, reset: 50 * sec},
		{at: 20 * sec, hits: 1, ok: true, remaining: 0, reset: 40 * sec},
		{at: 30 * sec, hits: 1, ok: false, remaining: 0, reset: 30 * sec, retry: 30 * sec},
		{at: 30 * sec, hits: 2, ok: false, remaining: 0, reset: 30 * sec, retry: 40 * sec},
		{at: 60*sec - us, hits: 1, ok: false, remaining: 0, reset: us, retry: us},
		{at: 60 * sec, hits: 1, ok: true, remaining: 0, reset: 10 * sec}, // the hit of t0 left
		{at: 61 * sec, hits: 1, refund: true, ok: true, remaining: 1, reset: 9 * sec},
		{at: 61 * sec, hits: 4, ok: false, remaining: 1, reset: 9 * sec, retry: 60 * sec},
		{at: 200 * sec, hits: 0, ok: true, remaining: 3, reset: 0},
	})
}

func TestTokenBucket(t *testing.T) {
	// 10 per second (one token per 100ms), capacity 20.
	runSteps(t, limit(descriptors.TokenBucket, 10, time.Second, 20), []step{
		{at: 0, hits: 20, ok: true, remaining: 0, reset: 2 * sec},
		{at: 0, hits: 1, ok: false, remaining: 0, reset: 2 * sec, retry: 100 * ms},
		{at: 100 * ms, hits: 1, ok: true, remaining: 0, reset: 2 * sec},
		{at: 1100 * ms, hits: 0, ok: true, remaining: 10, reset: sec},
		{at: 1100 * ms, hits: 21, ok: false, remaining: 10, reset: sec, retry: sec},
		{at: 1100 * ms, hits: 11, ok: false, remaining: 10, reset: sec, retry: 100 * ms},
		{at: 1100 * ms, hits: 5, refund: true, ok: true, remaining: 15, reset: 500 * ms},
		{at: 1100 * ms, hits: 500, refund: true, ok: true, remaining: 20, reset: 0},
		{at: 10 * sec, hits: 20, ok: true, remaining: 0, reset: 2 * sec},
	})
}

func TestTokenBucketRoundsIntervalUp(t *testing.T) {
	// 3 per second: the interval is ceil(1s/3) = 333334µs.
	runSteps(t, limit(descriptors.TokenBucket, 3, time.Second, 1), []step{
		{at: 0, hits: 1, ok: true, remaining: 0, reset: 333334 * us},
		{at: 333333 * us, hits: 1, ok: false, remaining: 0, reset: us, retry: us},
		{at: 333334 * us, hits: 1, ok: true, remaining: 0, reset: 333334 * us},
	})
}

func TestTokenBucketZeroLimit(t *testing.T) {
	runSteps(t, limit(descriptors.TokenBucket, 0, time.Second, 0), []step{
		{at: 0, hits: 1, ok: false, remaining: 0, reset: 0, retry: sec},
		{at: 0, hits: 0, ok: true, remaining: 0, reset: 0},
	})
}

// Regression test for the reference's hits_addend overflow: hits of 2^63 and
// more were sent as a negative INCRBY there. Here hits are bounded by MaxHits
// and every algorithm denies them without arithmetic that could wrap.
func TestHugeHitsNeverOverflow(t *testing.T) {
	huge := []uint64{MaxHits, math.MaxInt64, 1 << 63, math.MaxUint64}
	for _, alg := range []descriptors.Algorithm{descriptors.FixedWindow, descriptors.SlidingWindow, descriptors.SlidingLog, descriptors.TokenBucket} {
		l := limit(alg, math.MaxUint32, 100*365*24*time.Hour, math.MaxUint32)
		if alg == descriptors.TokenBucket {
			l = limit(alg, 1_000_000, time.Second, 1_000_000)
		}
		if alg == descriptors.SlidingLog {
			l = limit(alg, 100_000, time.Hour, 0)
		}
		for _, h := range huge {
			var st State
			v := Step(l, st, t0, h, false)
			if h <= uint64(l.RequestsPerUnit) {
				if !v.Admitted || v.Remaining != 0 {
					t.Errorf("%s: Step(hits=%d) = (%v, %d), want the whole limit consumed", alg, h, v.Admitted, v.Remaining)
				}
				continue
			}
			if v.Admitted {
				t.Errorf("%s: Step(hits=%d) admitted over a limit of %d", alg, h, l.RequestsPerUnit)
			}
			if v.Remaining != uint64(l.RequestsPerUnit) {
				t.Errorf("%s: Step(hits=%d) remaining = %d, want %d (nothing consumed)", alg, h, v.Remaining, l.RequestsPerUnit)
			}
			r := Step(l, st, t0, h, true)
			if !r.Admitted || r.Remaining != uint64(l.RequestsPerUnit) {
				t.Errorf("%s: refund of %d = (%v, %d), want (true, %d)", alg, h, r.Admitted, r.Remaining, l.RequestsPerUnit)
			}
		}
	}
}

func TestExpiry(t *testing.T) {
	w := time.Minute
	for _, tc := range []struct {
		alg  descriptors.Algorithm
		hits uint64
		want time.Duration // after t0; -1 = 0 (already expired)
	}{
		{descriptors.FixedWindow, 1, w},
		{descriptors.FixedWindow, 0, -1},
		{descriptors.SlidingWindow, 1, 2 * w},
		{descriptors.SlidingLog, 1, w},
		{descriptors.SlidingLog, 0, -1},
		{descriptors.TokenBucket, 1, 6 * sec},
	} {
		l := limit(tc.alg, 10, w, 10)
		v := Step(l, State{}, t0, tc.hits, false)
		got := Expiry(l, &v.Next)
		want := int64(0)
		if tc.want >= 0 {
			want = t0.Add(tc.want).UnixMicro()
		}
		if got != want {
			t.Errorf("%s after %d hits at t0: Expiry = %d, want %d", tc.alg, tc.hits, got, want)
		}
	}
}
