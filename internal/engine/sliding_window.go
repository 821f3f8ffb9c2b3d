package engine

import (
	"math"
	"time"
)

// slidingWindow is Cloudflare's estimate of a sliding window: two adjacent
// fixed windows, the previous one weighted by the part of it that still
// overlaps the sliding window ending now. State: Count hits in the window
// that starts at Start, Prev hits in the window before it.
type slidingWindow struct{}

// SlidingWindow is the algorithm's name (Spec.Algorithm).
const SlidingWindow = "sliding_window"

func (slidingWindow) name() string { return SlidingWindow }
func (slidingWindow) code() uint8  { return 1 }

func (a slidingWindow) compile(s *Spec, r *Rule, errs *specErrors) algorithm {
	noBurst(s, r, errs)
	return a
}

func (slidingWindow) counterID(r *Rule) string { return windowID("sw", r) }

func (slidingWindow) normalize(r *Rule, st *State, t int64) int64 {
	w := r.window()
	ws := windowStart(t, w)
	switch {
	case ws < st.Start:
		return st.Start // a later window was seen: no time passes before it
	case ws == st.Start:
	case ws-w == st.Start:
		// The hits held are carried out of the window now previous into
		// the new one, where they weigh fully (hold).
		st.Start, st.Prev, st.Count = ws, st.Count-min(st.Count, st.Held), st.Held
	default:
		st.Start, st.Prev, st.Count = ws, 0, st.Held
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

// WindowCount is the hits that a fixed or sliding window rule r compares
// with its limit at t, its state st normalized to t: the sliding window's
// estimate, or the fixed window's count. For tools that measure accuracy.
func WindowCount(r *Rule, st *State, t int64) float64 {
	if a, ok := r.alg.(slidingWindow); ok {
		return a.estimate(st, t, r.window())
	}
	return float64(st.Count)
}

func (a slidingWindow) admits(r *Rule, st *State, t int64, hits uint64) bool {
	limit := uint64(r.Limit)
	return hits <= limit && a.estimate(st, t, r.window())+float64(hits) <= float64(limit)
}

func (slidingWindow) consume(_ *Rule, st *State, _ int64, hits uint64) {
	st.Count += hits
}

// giveBack refunds hits, never below the hits held (a refund does not
// end a reservation).
func (slidingWindow) giveBack(_ *Rule, st *State, _ int64, hits uint64) {
	st.Count -= min(st.Count-min(st.Count, st.Held), hits)
}

// A sliding window holds a reserve's hits in its current window's count,
// which carries them into each new window while they are held (normalize):
// a hold weighs fully, never by the previous window's weight, so a
// request in flight counts whole until it settles.
func (slidingWindow) hold(_ *Rule, st *State, _ int64, hits uint64) { st.Count += hits }

func (slidingWindow) unhold(_ *Rule, st *State, _ int64, hits uint64) {
	st.Count -= min(st.Count, hits)
}

func (slidingWindow) canHold() bool     { return true }
func (slidingWindow) whyNoHold() string { return "" }

func (a slidingWindow) remaining(r *Rule, st *State, t int64) uint64 {
	rem := float64(r.Limit) - a.estimate(st, t, r.window())
	if rem <= 0 {
		return 0
	}
	return uint64(math.Floor(rem))
}

func (slidingWindow) resetAt(r *Rule, st *State, _ int64) int64 {
	return st.Start + r.window()
}

func (slidingWindow) retryAt(r *Rule, st *State, t int64, hits uint64) int64 {
	w := r.window()
	limit := uint64(r.Limit)
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

func (slidingWindow) expiry(r *Rule, st *State) int64 {
	switch {
	case st.Count > 0:
		return st.Start + 2*r.window()
	case st.Prev > 0:
		return st.Start + r.window()
	}
	return 0
}

func (slidingWindow) quotaWindow(r *Rule, end time.Time) time.Duration { return windowQuota(r, end) }
func (slidingWindow) capacity(r *Rule) uint64                          { return limitCapacity(r) }
func (slidingWindow) denialCoversMoreHits() bool                       { return false }
func (slidingWindow) stateSizeVaries() bool                            { return false }
func (slidingWindow) leasable() bool                                   { return false }
func (slidingWindow) refills() bool                                    { return false }
func (slidingWindow) inFlight() bool                                   { return false }
func (slidingWindow) windowInIdentity() bool                           { return true }

func (slidingWindow) calendarBounds(r *Rule, at int64) ([4]int64, bool) {
	return noCalendarBounds(r, at)
}
