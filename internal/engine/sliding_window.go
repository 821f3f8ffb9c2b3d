package engine

import (
	"math"

	"github.com/rlsproject/rls/internal/descriptors"
)

// slidingWindow is Cloudflare's estimate of a sliding window: two adjacent
// fixed windows, the previous one weighted by the part of it that still
// overlaps the sliding window ending now. State: Count hits in the window
// that starts at Start, Prev hits in the window before it.
type slidingWindow struct{}

func (slidingWindow) normalize(l *descriptors.Limit, st *State, t int64) int64 {
	w := window(l)
	ws := windowStart(t, w)
	switch {
	case ws < st.Start:
		return st.Start // a later window was seen: no time passes before it
	case ws == st.Start:
	case ws-w == st.Start:
		st.Start, st.Prev, st.Count = ws, st.Count, 0
	default:
		st.Start, st.Prev, st.Count = ws, 0, 0
	}
	return t
}

// estimate is the hits in the sliding window ending at t. The Lua script
// computes it with the same IEEE-754 operations in the same order; the
// explicit float64 conversions keep Go from fusing them into an FMA.
func (slidingWindow) estimate(st *State, t, w int64) float64 {
	weight := float64(w-(t-st.Start)) / float64(w)
	est := float64(float64(st.Prev) * weight)
	return est + float64(st.Count)
}

// WindowCount is the hits that a fixed or sliding window (l) compares with
// its limit at t, its state st normalized to t: the sliding window's
// estimate, or the fixed window's count. For tools that measure accuracy.
func WindowCount(l *descriptors.Limit, st *State, t int64) float64 {
	if l.Algorithm == descriptors.SlidingWindow {
		return slidingWindow{}.estimate(st, t, window(l))
	}
	return float64(st.Count)
}

func (a slidingWindow) admits(l *descriptors.Limit, st *State, t int64, hits uint64) bool {
	limit := uint64(l.RequestsPerUnit)
	return hits <= limit && a.estimate(st, t, window(l))+float64(hits) <= float64(limit)
}

func (slidingWindow) consume(_ *descriptors.Limit, st *State, _ int64, hits uint64) {
	st.Count += hits
}

func (slidingWindow) giveBack(_ *descriptors.Limit, st *State, _ int64, hits uint64) {
	st.Count -= min(st.Count, hits)
}

func (a slidingWindow) remaining(l *descriptors.Limit, st *State, t int64) uint64 {
	r := float64(l.RequestsPerUnit) - a.estimate(st, t, window(l))
	if r <= 0 {
		return 0
	}
	return uint64(math.Floor(r))
}

func (slidingWindow) resetAt(l *descriptors.Limit, st *State, _ int64) int64 {
	return st.Start + window(l)
}

func (slidingWindow) retryAt(l *descriptors.Limit, st *State, t int64, hits uint64) int64 {
	w := window(l)
	limit := uint64(l.RequestsPerUnit)
	end := st.Start + w
	if hits > limit {
		return never
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
}

func (slidingWindow) expiry(l *descriptors.Limit, st *State) int64 {
	switch {
	case st.Count > 0:
		return st.Start + 2*window(l)
	case st.Prev > 0:
		return st.Start + window(l)
	}
	return 0
}
