package engine

import "github.com/rlsproject/rls/internal/descriptors"

// fixedWindow counts hits per window, windows aligned to the Unix epoch (as
// envoyproxy/ratelimit). State: Count hits in the window that starts at
// Start.
type fixedWindow struct{}

func (fixedWindow) normalize(l *descriptors.Limit, st *State, t int64) int64 {
	return enterWindow(st, windowStart(t, window(l)), t)
}

// enterWindow moves a fixed or calendar window's state at instant t into
// the window starting at ws, and returns the counter's instant: a state
// that has seen a later window stays in it.
func enterWindow(st *State, ws, t int64) int64 {
	switch {
	case ws > st.Start:
		st.Start, st.Count = ws, 0
	case ws < st.Start:
		return st.Start // a later window was seen: no time passes before it
	}
	return t
}

func (fixedWindow) admits(l *descriptors.Limit, st *State, _ int64, hits uint64) bool {
	limit := uint64(l.RequestsPerUnit)
	return hits <= limit && st.Count+hits <= limit // hits ≤ limit first: no overflow
}

func (fixedWindow) consume(_ *descriptors.Limit, st *State, _ int64, hits uint64) {
	st.Count += hits
}

func (fixedWindow) giveBack(_ *descriptors.Limit, st *State, _ int64, hits uint64) {
	st.Count -= min(st.Count, hits)
}

func (fixedWindow) remaining(l *descriptors.Limit, st *State, _ int64) uint64 {
	limit := uint64(l.RequestsPerUnit)
	return limit - min(limit, st.Count)
}

func (fixedWindow) resetAt(l *descriptors.Limit, st *State, _ int64) int64 {
	return st.Start + window(l)
}

func (fixedWindow) retryAt(l *descriptors.Limit, st *State, _ int64, hits uint64) int64 {
	if hits > uint64(l.RequestsPerUnit) {
		return never
	}
	return st.Start + window(l)
}

func (fixedWindow) expiry(l *descriptors.Limit, st *State) int64 {
	if st.Count == 0 {
		return 0
	}
	return st.Start + window(l)
}
