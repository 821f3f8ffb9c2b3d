package engine

import "github.com/rlsproject/rls/internal/descriptors"

// tokenBucket is GCRA: a bucket of Burst tokens refilled at RequestsPerUnit
// per window, kept as one instant. State: TAT, the theoretical arrival time:
// the bucket is full from TAT on, and each hit pushes it one emission
// interval later. A limit of 0 admits nothing (and keeps no state).
type tokenBucket struct{}

// A backward step of the clock leaves the TAT as it is, so the bucket seems
// emptier by the step (it never refills): the GCRA state has no instant of
// its own to hold the counter's time to.

// interval returns the emission interval ceil(window/limit) in microseconds,
// for a limit > 0. The config guarantees it is ≥ 1 and that Burst × interval
// stays far below 2^53.
func (tokenBucket) interval(l *descriptors.Limit) int64 {
	w, r := window(l), int64(l.RequestsPerUnit)
	return (w + r - 1) / r
}

func (tokenBucket) normalize(_ *descriptors.Limit, st *State, t int64) int64 {
	st.TAT = max(st.TAT, t)
	return t
}

func (a tokenBucket) admits(l *descriptors.Limit, st *State, t int64, hits uint64) bool {
	if l.RequestsPerUnit == 0 {
		return hits == 0
	}
	if hits > uint64(l.Burst) {
		return false // also keeps the product below from overflowing
	}
	i := a.interval(l)
	return st.TAT+int64(hits)*i-t <= int64(l.Burst)*i
}

// MaxBucketAhead bounds how far ahead of now a consumption puts a bucket's
// TAT, in µs (2^50, about 35 years): hits that count when denied push it
// on without end, and past 2^63 µs it would wrap round to a full bucket.
// decide.lua keeps the same bound (TB_MAX_AHEAD, where µs instants stay
// exact doubles).
const MaxBucketAhead = 1 << 50

func (a tokenBucket) consume(l *descriptors.Limit, st *State, t int64, hits uint64) {
	if l.RequestsPerUnit == 0 {
		return
	}
	i := a.interval(l)
	if room := max(t+MaxBucketAhead-st.TAT, 0); hits > uint64(room/i) {
		st.TAT = max(st.TAT, t+MaxBucketAhead)
	} else {
		st.TAT += int64(hits) * i
	}
}

func (a tokenBucket) giveBack(l *descriptors.Limit, st *State, t int64, hits uint64) {
	if l.RequestsPerUnit == 0 {
		return
	}
	i := a.interval(l)
	if d := st.TAT - t; hits >= uint64((d+i-1)/i) {
		st.TAT = t
	} else {
		st.TAT -= int64(hits) * i
	}
}

func (a tokenBucket) remaining(l *descriptors.Limit, st *State, t int64) uint64 {
	if l.RequestsPerUnit == 0 {
		return 0
	}
	i := a.interval(l)
	tau := int64(l.Burst) * i
	d := st.TAT - t
	if d >= tau {
		return 0
	}
	return uint64((tau - d) / i)
}

func (tokenBucket) resetAt(_ *descriptors.Limit, st *State, _ int64) int64 {
	return st.TAT
}

func (a tokenBucket) retryAt(l *descriptors.Limit, st *State, _ int64, hits uint64) int64 {
	if l.RequestsPerUnit == 0 || hits > uint64(l.Burst) {
		return never
	}
	i := a.interval(l)
	return st.TAT + int64(hits)*i - int64(l.Burst)*i
}

func (tokenBucket) expiry(_ *descriptors.Limit, st *State) int64 {
	return st.TAT
}
