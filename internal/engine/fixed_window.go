package engine

import "time"

// fixedWindow counts hits per window, windows aligned to the Unix epoch (as
// envoyproxy/ratelimit). State: Count hits in the window that starts at
// Start. With calendar: true it is a calendarWindow.
type fixedWindow struct{}

// FixedWindow is the algorithm's name (Spec.Algorithm).
const FixedWindow = "fixed_window"

func (fixedWindow) name() string { return FixedWindow }
func (fixedWindow) code() uint8  { return 0 }

func (a fixedWindow) compile(s *Spec, r *Rule, errs *specErrors) algorithm {
	noBurst(s, r, errs)
	return a
}

func (fixedWindow) counterID(r *Rule) string { return windowID("fw", r) }

func (fixedWindow) normalize(r *Rule, st *State, t int64) int64 {
	return enterWindow(st, windowStart(t, r.window()), t)
}

// enterWindow moves a fixed or calendar window's state at instant t into
// the window starting at ws, and returns the counter's instant: a state
// that has seen a later window stays in it. A new window starts with the
// hits that reservations hold (taken again in it: their old window's
// lapse there).
func enterWindow(st *State, ws, t int64) int64 {
	switch {
	case ws > st.Start:
		st.Start, st.Count = ws, st.Held
	case ws < st.Start:
		return st.Start // a later window was seen: no time passes before it
	}
	return t
}

func (fixedWindow) admits(r *Rule, st *State, _ int64, hits uint64) bool {
	limit := uint64(r.Limit)
	return hits <= limit && st.Count+hits <= limit // hits ≤ limit first: no overflow
}

func (fixedWindow) consume(_ *Rule, st *State, _ int64, hits uint64) {
	st.Count += hits
}

// giveBack refunds hits, never below the hits held (a refund does not
// end a reservation).
func (fixedWindow) giveBack(_ *Rule, st *State, _ int64, hits uint64) {
	st.Count -= min(st.Count-min(st.Count, st.Held), hits)
}

// A window holds a reserve's hits in its count, which carries them into
// each new window (enterWindow) while they are held.
func (fixedWindow) hold(_ *Rule, st *State, _ int64, hits uint64) { st.Count += hits }

func (fixedWindow) unhold(_ *Rule, st *State, _ int64, hits uint64) {
	st.Count -= min(st.Count, hits)
}

func (fixedWindow) canHold() bool     { return true }
func (fixedWindow) whyNoHold() string { return "" }

func (fixedWindow) remaining(r *Rule, st *State, _ int64) uint64 {
	limit := uint64(r.Limit)
	return limit - min(limit, st.Count)
}

func (fixedWindow) resetAt(r *Rule, st *State, _ int64) int64 {
	return st.Start + r.window()
}

func (fixedWindow) retryAt(r *Rule, st *State, _ int64, hits uint64) int64 {
	if hits > uint64(r.Limit) {
		return never
	}
	return st.Start + r.window()
}

func (fixedWindow) expiry(r *Rule, st *State) int64 {
	if st.Count == 0 {
		return 0
	}
	return st.Start + r.window()
}

func (fixedWindow) quotaWindow(r *Rule, end time.Time) time.Duration { return windowQuota(r, end) }
func (fixedWindow) capacity(r *Rule) uint64                          { return limitCapacity(r) }

// A denial's retry instant is the window's end whatever the hits.
func (fixedWindow) denialCoversMoreHits() bool { return true }
func (fixedWindow) stateSizeVaries() bool      { return false }
func (fixedWindow) leasable() bool             { return true }
func (fixedWindow) refills() bool              { return false }
func (fixedWindow) inFlight() bool             { return false }
func (fixedWindow) windowInIdentity() bool     { return true }

func (fixedWindow) calendarBounds(r *Rule, at int64) ([4]int64, bool) {
	return noCalendarBounds(r, at)
}
