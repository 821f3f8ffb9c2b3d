package engine

import "github.com/rlsproject/rls/internal/descriptors"

// slidingLog is exact: it logs the instant of every admitted hit and counts
// those of the last window. State: Log, the instants, oldest first.
type slidingLog struct{}

func (slidingLog) normalize(l *descriptors.Limit, st *State, t int64) int64 {
	if n := len(st.Log); n > 0 {
		t = max(t, st.Log[n-1]) // never before the newest hit
	}
	// An entry at instant e counts while t - e < w.
	w := window(l)
	i := 0
	for i < len(st.Log) && st.Log[i] <= t-w {
		i++
	}
	st.Log = st.Log[i:]
	return t
}

func (slidingLog) admits(l *descriptors.Limit, st *State, _ int64, hits uint64) bool {
	limit := uint64(l.RequestsPerUnit)
	return hits <= limit && uint64(len(st.Log))+hits <= limit
}

func (slidingLog) consume(_ *descriptors.Limit, st *State, t int64, hits uint64) {
	for range hits {
		st.Log = append(st.Log, t)
	}
}

func (slidingLog) giveBack(_ *descriptors.Limit, st *State, _ int64, hits uint64) {
	n := uint64(len(st.Log))
	// Copy before shrinking: the caller's snapshot may share the array.
	st.Log = append([]int64(nil), st.Log[:n-min(n, hits)]...)
}

func (slidingLog) remaining(l *descriptors.Limit, st *State, _ int64) uint64 {
	limit, n := uint64(l.RequestsPerUnit), uint64(len(st.Log))
	return limit - min(limit, n)
}

func (slidingLog) resetAt(l *descriptors.Limit, st *State, t int64) int64 {
	if len(st.Log) == 0 {
		return t
	}
	return st.Log[0] + window(l)
}

func (slidingLog) retryAt(l *descriptors.Limit, st *State, t int64, hits uint64) int64 {
	w := window(l)
	limit, n := uint64(l.RequestsPerUnit), uint64(len(st.Log))
	if hits > limit {
		return never
	}
	if n+hits <= limit {
		return t + w
	}
	return st.Log[n+hits-limit-1] + w
}

func (slidingLog) expiry(l *descriptors.Limit, st *State) int64 {
	if len(st.Log) == 0 {
		return 0
	}
	return st.Log[len(st.Log)-1] + window(l)
}
