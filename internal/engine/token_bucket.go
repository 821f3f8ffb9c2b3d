package engine

import (
	"math"
	"math/bits"
	"time"
)

// tokenBucket is GCRA: a bucket of Burst tokens refilled at Limit per
// window, kept as one instant. State: TAT, the theoretical arrival time:
// the bucket is full from TAT on, and each hit pushes it one emission
// interval later. A limit of 0 admits nothing (and keeps no state).
type tokenBucket struct{}

// A backward step of the clock leaves the TAT as it is, so the bucket seems
// emptier by the step (it never refills): the GCRA state has no instant of
// its own to hold the counter's time to.

// TokenBucket is the algorithm's name (Spec.Algorithm).
const TokenBucket = "token_bucket"

func (tokenBucket) name() string { return TokenBucket }
func (tokenBucket) code() uint8  { return 3 }

// compile defaults and bounds the burst: one token per microsecond at most,
// and the bucket's span (burst × emission interval) within 2^53 µs.
func (a tokenBucket) compile(s *Spec, r *Rule, errs *specErrors) algorithm {
	r.Burst = s.Burst.Or(r.Limit)
	windowMicros := uint64(r.Window / time.Microsecond)
	switch {
	case r.Limit == 0:
		if r.Burst > 0 {
			errs.add("burst", false, "burst %d needs requests_per_unit above 0 (a token_bucket with requests_per_unit 0 denies every request)", r.Burst)
		}
		return a
	case s.Burst.Set && r.Burst == 0:
		errs.add("burst", false, "burst must be at least 1 when requests_per_unit is above 0 (a bucket of 0 admits nothing)")
		return a
	case uint64(r.Limit) > windowMicros:
		errs.add("requests_per_unit", false, "requests_per_unit %d per %d %s is more than one token per microsecond (token_bucket allows at most 1000000 per second)",
			r.Limit, r.Multiplier, r.Unit)
		return a
	}
	interval := (windowMicros + uint64(r.Limit) - 1) / uint64(r.Limit)
	if uint64(r.Burst) > maxTokenSpan/interval {
		if s.Burst.Set {
			errs.add("burst", false, "burst %d × emission interval %dµs is more than 2^53µs (about 285 years)", r.Burst, interval)
		} else {
			errs.add("requests_per_unit", false, "requests_per_unit %d (the default burst) × emission interval %dµs is more than 2^53µs (about 285 years)", r.Burst, interval)
		}
	}
	return a
}

func (tokenBucket) counterID(r *Rule) string { return windowID("tb", r) }

// interval returns the emission interval ceil(window/limit) in microseconds,
// for a limit > 0. Compile guarantees it is ≥ 1 and that Burst × interval
// stays far below 2^53.
func (tokenBucket) interval(r *Rule) int64 {
	w, n := r.window(), int64(r.Limit)
	return (w + n - 1) / n
}

func (tokenBucket) normalize(_ *Rule, st *State, t int64) int64 {
	st.TAT = max(st.TAT, t)
	return t
}

func (a tokenBucket) admits(r *Rule, st *State, t int64, hits uint64) bool {
	if r.Limit == 0 {
		return hits == 0
	}
	if hits > uint64(r.Burst) {
		return false // also keeps the product below from overflowing
	}
	i := a.interval(r)
	return st.TAT+int64(hits)*i-t <= int64(r.Burst)*i
}

// MaxBucketAhead bounds how far ahead of now a consumption puts a bucket's
// TAT, in µs (2^50, about 35 years): hits that count when denied push it
// on without end, and past 2^63 µs it would wrap round to a full bucket.
// The Redis scripts keep the same bound (TB_MAX_AHEAD, where µs instants
// stay exact doubles).
const MaxBucketAhead = 1 << 50

func (a tokenBucket) consume(r *Rule, st *State, t int64, hits uint64) {
	if r.Limit == 0 {
		return
	}
	i := a.interval(r)
	if room := max(t+MaxBucketAhead-st.TAT, 0); hits > uint64(room/i) {
		st.TAT = max(st.TAT, t+MaxBucketAhead)
	} else {
		st.TAT += int64(hits) * i
	}
}

func (a tokenBucket) giveBack(r *Rule, st *State, t int64, hits uint64) {
	if r.Limit == 0 {
		return
	}
	i := a.interval(r)
	if d := st.TAT - t; hits >= uint64((d+i-1)/i) {
		st.TAT = t
	} else {
		st.TAT -= int64(hits) * i
	}
}

// A bucket holds a reserve's hits as tokens taken (its TAT), which refill
// as any; a hold that ends gives its tokens back (never more than a full
// bucket).
func (a tokenBucket) hold(r *Rule, st *State, t int64, hits uint64)   { a.consume(r, st, t, hits) }
func (a tokenBucket) unhold(r *Rule, st *State, t int64, hits uint64) { a.giveBack(r, st, t, hits) }
func (tokenBucket) canHold() bool                                     { return true }
func (tokenBucket) whyNoHold() string                                 { return "" }

func (a tokenBucket) remaining(r *Rule, st *State, t int64) uint64 {
	if r.Limit == 0 {
		return 0
	}
	i := a.interval(r)
	tau := int64(r.Burst) * i
	d := st.TAT - t
	if d >= tau {
		return 0
	}
	return uint64((tau - d) / i)
}

func (tokenBucket) resetAt(_ *Rule, st *State, _ int64) int64 {
	return st.TAT
}

func (a tokenBucket) retryAt(r *Rule, st *State, _ int64, hits uint64) int64 {
	if r.Limit == 0 || hits > uint64(r.Burst) {
		return never
	}
	i := a.interval(r)
	return st.TAT + int64(hits)*i - int64(r.Burst)*i
}

func (tokenBucket) expiry(_ *Rule, st *State) int64 {
	return st.TAT
}

// quotaWindow is the time the empty bucket takes to fill, ⌈B × W ÷ R⌉
// whole seconds, computed exactly: B × W can pass 2⁶⁴ µs, so in 128 bits
// (Compile keeps the quotient below 2⁵³ µs; beyond, it saturates). A
// bucket that refills nothing advertises its window.
func (tokenBucket) quotaWindow(r *Rule, _ time.Time) time.Duration {
	if r.Limit == 0 {
		return r.Window
	}
	const maxSeconds = math.MaxInt64 / uint64(time.Second)
	den := uint64(r.Limit) * 1e6
	hi, lo := bits.Mul64(uint64(r.Burst), uint64(r.Window.Microseconds()))
	if hi >= den {
		return time.Duration(maxSeconds) * time.Second
	}
	q, rem := bits.Div64(hi, lo, den)
	if rem > 0 {
		q++
	}
	return time.Duration(min(q, maxSeconds)) * time.Second
}

// capacity is the burst: none when the bucket refills nothing.
func (tokenBucket) capacity(r *Rule) uint64 {
	if r.Limit == 0 {
		return 0
	}
	return uint64(r.Burst)
}

func (tokenBucket) denialCoversMoreHits() bool { return false }
func (tokenBucket) stateSizeVaries() bool      { return false }
func (tokenBucket) leasable() bool             { return true }

// The bucket refills by the microsecond: it has no window, its burst is
// its capacity, and hits given back count whenever they land.
func (tokenBucket) refills() bool          { return true }
func (tokenBucket) inFlight() bool         { return false }
func (tokenBucket) windowInIdentity() bool { return true }

func (tokenBucket) calendarBounds(r *Rule, at int64) ([4]int64, bool) {
	return noCalendarBounds(r, at)
}
