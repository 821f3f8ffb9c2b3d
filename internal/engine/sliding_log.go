package engine

import "time"

// slidingLog is exact: it logs the hits each request takes, with their
// instant, and counts those of the last window. State: Log, one entry per
// consumption (its instant and hits), oldest first, and Count, the hits in
// Log. An entry holds a request's hits whatever their number, so a log
// holds at most as many entries as the limit: the hits of a request beyond
// that (hits counted when denied, or a limit lowered by a reload) go into
// its newest entry, which takes their instant: stricter by the time since
// that entry, and bounded. The hits that reservations hold are counted in
// Count beside the log (Count = State.Held + the entries' hits): they have
// no instant, and leave only when their hold ends (unhold).
type slidingLog struct{}

// SlidingLog is the algorithm's name (Spec.Algorithm).
const SlidingLog = "sliding_log"

func (slidingLog) name() string { return SlidingLog }
func (slidingLog) code() uint8  { return 2 }

func (a slidingLog) compile(s *Spec, r *Rule, errs *specErrors) algorithm {
	noBurst(s, r, errs)
	if r.Limit > MaxSlidingLog {
		errs.add("requests_per_unit", false, "requests_per_unit %d is too large for sliding_log (at most %d: it keeps one entry per hit; use sliding_window)",
			r.Limit, MaxSlidingLog)
	}
	return a
}

func (slidingLog) counterID(r *Rule) string { return windowID("sl", r) }

func (slidingLog) normalize(r *Rule, st *State, t int64) int64 {
	if n := len(st.Log); n > 0 {
		t = max(t, st.Log[n-1].At) // never before the newest entry
	}
	// An entry at instant e counts while t - e < w.
	w := r.window()
	i := 0
	for i < len(st.Log) && st.Log[i].At <= t-w {
		st.Count -= min(st.Count, st.Log[i].Hits)
		i++
	}
	st.Log = st.Log[i:]
	if len(st.Log) == 0 {
		st.Count = st.Held
	}
	return t
}

func (slidingLog) admits(r *Rule, st *State, _ int64, hits uint64) bool {
	limit := uint64(r.Limit)
	return hits <= limit && st.Count+hits <= limit
}

func (slidingLog) consume(r *Rule, st *State, t int64, hits uint64) {
	if hits == 0 {
		return
	}
	st.Count += hits
	if n := len(st.Log); n > 0 && n >= max(int(r.Limit), 1) {
		st.Log[n-1] = LogEntry{At: t, Hits: st.Log[n-1].Hits + hits}
		return
	}
	st.Log = append(st.Log, LogEntry{At: t, Hits: hits})
}

func (slidingLog) giveBack(_ *Rule, st *State, _ int64, hits uint64) {
	// Copy before changing: the caller's snapshot may share the array.
	st.Log = append([]LogEntry(nil), st.Log...)
	for hits > 0 && len(st.Log) > 0 {
		last := &st.Log[len(st.Log)-1]
		if last.Hits > hits {
			last.Hits -= hits
			st.Count -= hits
			return
		}
		hits -= last.Hits
		st.Count -= min(st.Count, last.Hits)
		st.Log = st.Log[:len(st.Log)-1]
	}
}

// A log holds a reserve's hits in its count, not as an entry: they leave
// when the hold ends, not a window after it was taken.
func (slidingLog) hold(_ *Rule, st *State, _ int64, hits uint64) { st.Count += hits }

func (slidingLog) unhold(_ *Rule, st *State, _ int64, hits uint64) {
	st.Count -= min(st.Count, hits)
}

func (slidingLog) canHold() bool     { return true }
func (slidingLog) whyNoHold() string { return "" }

func (slidingLog) remaining(r *Rule, st *State, _ int64) uint64 {
	limit := uint64(r.Limit)
	return limit - min(limit, st.Count)
}

func (slidingLog) resetAt(r *Rule, st *State, t int64) int64 {
	if len(st.Log) == 0 {
		return t
	}
	return st.Log[0].At + r.window()
}

// retryAt is when enough of the oldest entries have left the window for
// hits to fit: the instant the entry that frees the last needed hit
// leaves.
func (slidingLog) retryAt(r *Rule, st *State, t int64, hits uint64) int64 {
	w := r.window()
	limit := uint64(r.Limit)
	if hits > limit {
		return never
	}
	if st.Count+hits <= limit {
		return t + w
	}
	excess := st.Count + hits - limit
	for _, e := range st.Log {
		if e.Hits >= excess {
			return e.At + w
		}
		excess -= e.Hits
	}
	return t + w // not reached: Count is the sum of the entries
}

func (slidingLog) expiry(r *Rule, st *State) int64 {
	if len(st.Log) == 0 {
		return 0
	}
	return st.Log[len(st.Log)-1].At + r.window()
}

func (slidingLog) quotaWindow(r *Rule, end time.Time) time.Duration { return windowQuota(r, end) }
func (slidingLog) capacity(r *Rule) uint64                          { return limitCapacity(r) }
func (slidingLog) denialCoversMoreHits() bool                       { return false }

// The log grows and shrinks with the consumptions in its window.
func (slidingLog) stateSizeVaries() bool  { return true }
func (slidingLog) leasable() bool         { return false }
func (slidingLog) refills() bool          { return false }
func (slidingLog) inFlight() bool         { return false }
func (slidingLog) windowInIdentity() bool { return true }

func (slidingLog) calendarBounds(r *Rule, at int64) ([4]int64, bool) {
	return noCalendarBounds(r, at)
}
