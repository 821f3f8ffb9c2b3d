package engine

import (
	"math"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
)

// State is the stored state of one counter: one limit of one descriptor.
// The zero value is a counter that has seen nothing. Which fields are used
// depends on the limit's algorithm:
//
//   - fixed_window: Count hits in the window that starts at Start.
//   - sliding_window: Count hits in the window that starts at Start, Prev
//     hits in the window before it.
//   - token_bucket: TAT, the theoretical arrival time of GCRA.
//   - sliding_log: Log, the instants of the admitted hits, oldest first.
//
// All instants are microseconds since the Unix epoch. A State is not safe
// for concurrent use; stores guard it.
type State struct {
	Start int64
	Count uint64
	Prev  uint64
	TAT   int64
	Log   []int64
}

// Verdict is the outcome of Step.
type Verdict struct {
	Admitted bool
	// Next is the state after the step: after consumption (or refund) when
	// admitted, else the state as it stands at now.
	Next       State
	Remaining  uint64
	Reset      time.Duration
	RetryAfter time.Duration
}

// Step judges hits against st at now under limit l, as the only item of a
// request: it is the pure form of the algorithms (st is not modified).
// A refund always admits.
func Step(l *descriptors.Limit, st State, now time.Time, hits uint64, refund bool) Verdict {
	t := now.UnixMicro()
	st.Log = append([]int64(nil), st.Log...)
	normalize(l, &st, t)
	var v Verdict
	switch {
	case refund:
		v.Admitted = true
		giveBack(l, &st, t, hits)
	case admits(l, &st, t, hits):
		v.Admitted = true
		consume(l, &st, t, hits)
	default:
		v.RetryAfter = micros(retryAt(l, &st, t, hits) - t)
	}
	v.Next = st
	v.Remaining = remaining(l, &st, t)
	v.Reset = micros(resetAt(l, &st, t) - t)
	return v
}

// Expiry returns the instant from which st is equivalent to the zero State
// for limit l: a store may forget it then. 0 means it already is.
func Expiry(l *descriptors.Limit, st *State) int64 {
	w := window(l)
	switch l.Algorithm {
	case descriptors.FixedWindow:
		if st.Count == 0 {
			return 0
		}
		return st.Start + w
	case descriptors.SlidingWindow:
		switch {
		case st.Count > 0:
			return st.Start + 2*w
		case st.Prev > 0:
			return st.Start + w
		}
		return 0
	case descriptors.TokenBucket:
		return st.TAT
	case descriptors.SlidingLog:
		if len(st.Log) == 0 {
			return 0
		}
		return st.Log[len(st.Log)-1] + w
	}
	return 0
}

func micros(us int64) time.Duration {
	if us < 0 {
		return 0
	}
	return time.Duration(us) * time.Microsecond
}

// window returns the limit's window in microseconds (≥ 1 for a valid limit).
func window(l *descriptors.Limit) int64 { return l.Window.Microseconds() }

// windowStart returns the start of the epoch-aligned window holding t.
func windowStart(t, w int64) int64 { return t - t%w }

// interval returns the GCRA emission interval ceil(window/limit) in
// microseconds, for a limit > 0. The config guarantees it is ≥ 1 and that
// Burst × interval stays far below 2^53.
func interval(l *descriptors.Limit) int64 {
	w, r := window(l), int64(l.RequestsPerUnit)
	return (w + r - 1) / r
}

// normalize brings st to instant t without changing what it means: window
// rollover, expired log entries dropped, TAT not in the past. A store may keep
// the normalized state whether or not the request is admitted.
func normalize(l *descriptors.Limit, st *State, t int64) {
	w := window(l)
	switch l.Algorithm {
	case descriptors.FixedWindow:
		if ws := windowStart(t, w); st.Start != ws {
			st.Start, st.Count = ws, 0
		}
	case descriptors.SlidingWindow:
		ws := windowStart(t, w)
		switch st.Start {
		case ws:
		case ws - w:
			st.Start, st.Prev, st.Count = ws, st.Count, 0
		default:
			st.Start, st.Prev, st.Count = ws, 0, 0
		}
	case descriptors.TokenBucket:
		if st.TAT < t {
			st.TAT = t
		}
	case descriptors.SlidingLog:
		// An entry at instant e counts while t - e < w.
		i := 0
		for i < len(st.Log) && st.Log[i] <= t-w {
			i++
		}
		st.Log = st.Log[i:]
	}
}

// slidingEstimate is the Cloudflare estimate of the hits in the sliding window
// ending at t: the previous window weighted by the part of it that still
// overlaps, plus the current window. The Lua script computes it with the same
// IEEE-754 operations in the same order; the explicit float64 conversions keep
// Go from fusing them into an FMA.
func slidingEstimate(st *State, t, w int64) float64 {
	weight := float64(w-(t-st.Start)) / float64(w)
	est := float64(float64(st.Prev) * weight)
	return est + float64(st.Count)
}

// admits reports whether hits fit at t (st normalized to t). With 0 hits it
// reports whether the limit is not exceeded (a look that consumes nothing).
func admits(l *descriptors.Limit, st *State, t int64, hits uint64) bool {
	limit := uint64(l.RequestsPerUnit)
	if l.Algorithm != descriptors.TokenBucket && hits > limit {
		return false // also keeps the sums below from overflowing
	}
	switch l.Algorithm {
	case descriptors.FixedWindow:
		return st.Count+hits <= limit
	case descriptors.SlidingWindow:
		return slidingEstimate(st, t, window(l))+float64(hits) <= float64(limit)
	case descriptors.SlidingLog:
		return uint64(len(st.Log))+hits <= limit
	case descriptors.TokenBucket:
		if limit == 0 {
			return hits == 0
		}
		if hits > uint64(l.Burst) {
			return false
		}
		i := interval(l)
		return st.TAT+int64(hits)*i-t <= int64(l.Burst)*i
	}
	return false
}

// consume takes hits at t (st normalized to t). It does not check the limit.
func consume(l *descriptors.Limit, st *State, t int64, hits uint64) {
	if hits == 0 {
		return
	}
	switch l.Algorithm {
	case descriptors.FixedWindow, descriptors.SlidingWindow:
		st.Count += hits
	case descriptors.SlidingLog:
		for range hits {
			st.Log = append(st.Log, t)
		}
	case descriptors.TokenBucket:
		if l.RequestsPerUnit > 0 {
			st.TAT += int64(hits) * interval(l)
		}
	}
}

// giveBack refunds hits at t (st normalized to t); counters never go below
// zero and a bucket never holds more than its burst.
func giveBack(l *descriptors.Limit, st *State, t int64, hits uint64) {
	switch l.Algorithm {
	case descriptors.FixedWindow, descriptors.SlidingWindow:
		st.Count -= min(st.Count, hits)
	case descriptors.SlidingLog:
		n := uint64(len(st.Log))
		// Copy before shrinking: the caller's snapshot may share the array.
		st.Log = append([]int64(nil), st.Log[:n-min(n, hits)]...)
	case descriptors.TokenBucket:
		if l.RequestsPerUnit == 0 {
			return
		}
		i := interval(l)
		d := st.TAT - t
		if hits >= uint64((d+i-1)/i) {
			st.TAT = t
		} else {
			st.TAT -= int64(hits) * i
		}
	}
}

// remaining returns the hits the limit still admits at t.
func remaining(l *descriptors.Limit, st *State, t int64) uint64 {
	limit := uint64(l.RequestsPerUnit)
	switch l.Algorithm {
	case descriptors.FixedWindow:
		return limit - min(limit, st.Count)
	case descriptors.SlidingWindow:
		r := float64(limit) - slidingEstimate(st, t, window(l))
		if r <= 0 {
			return 0
		}
		return uint64(math.Floor(r))
	case descriptors.SlidingLog:
		n := uint64(len(st.Log))
		return limit - min(limit, n)
	case descriptors.TokenBucket:
		if limit == 0 {
			return 0
		}
		i := interval(l)
		tau := int64(l.Burst) * i
		d := st.TAT - t
		if d >= tau {
			return 0
		}
		return uint64((tau - d) / i)
	}
	return 0
}

// resetAt returns the instant reported as the limit's reset (see Result.Reset).
func resetAt(l *descriptors.Limit, st *State, t int64) int64 {
	switch l.Algorithm {
	case descriptors.FixedWindow, descriptors.SlidingWindow:
		return st.Start + window(l)
	case descriptors.SlidingLog:
		if len(st.Log) == 0 {
			return t
		}
		return st.Log[0] + window(l)
	case descriptors.TokenBucket:
		return st.TAT
	}
	return t
}

// retryAt returns an instant no later than the first one at which hits would
// be admitted, nothing else being consumed meanwhile, for a request denied at
// t. Hits that can never be admitted give the end of the current window (or
// one emission interval), after which the caller asks again.
func retryAt(l *descriptors.Limit, st *State, t int64, hits uint64) int64 {
	w := window(l)
	limit := uint64(l.RequestsPerUnit)
	switch l.Algorithm {
	case descriptors.FixedWindow:
		return st.Start + w
	case descriptors.SlidingWindow:
		end := st.Start + w
		if hits > limit {
			return end
		}
		if st.Count+hits <= limit {
			// The previous window's weight has to decay.
			a := limit - st.Count - hits
			e := float64(w) - float64(a)*float64(w)/float64(st.Prev)
			return max(t+1, min(end, st.Start+int64(math.Floor(e))-1))
		}
		// Only in the next window, where this window becomes the previous one.
		a := limit - hits
		e := float64(w) - float64(a)*float64(w)/float64(st.Count)
		return max(end, min(end+w, end+int64(math.Floor(e))-1))
	case descriptors.SlidingLog:
		n := uint64(len(st.Log))
		if hits > limit || n+hits <= limit {
			return t + w
		}
		return st.Log[n+hits-limit-1] + w
	case descriptors.TokenBucket:
		if limit == 0 || hits > uint64(l.Burst) {
			return t + w
		}
		i := interval(l)
		return st.TAT + int64(hits)*i - int64(l.Burst)*i
	}
	return t + w
}
