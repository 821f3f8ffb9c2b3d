package engine

import "github.com/rlsproject/rls/internal/descriptors"

// slidingLog is exact: it logs the hits each request takes, with their
// instant, and counts those of the last window. State: Log, one entry per
// consumption (its instant and hits), oldest first, and Count, the hits in
// Log. An entry holds a request's hits whatever their number, so a log
// holds at most as many entries as the limit: the hits of a request beyond
// that (hits counted when denied, or a limit lowered by a reload) go into
// its newest entry, which takes their instant: stricter by the time since
// that entry, and bounded.
type slidingLog struct{}

func (slidingLog) normalize(l *descriptors.Limit, st *State, t int64) int64 {
	if n := len(st.Log); n > 0 {
		t = max(t, st.Log[n-1].At) // never before the newest entry
	}
	// An entry at instant e counts while t - e < w.
	w := window(l)
	i := 0
	for i < len(st.Log) && st.Log[i].At <= t-w {
		st.Count -= min(st.Count, st.Log[i].Hits)
		i++
	}
	st.Log = st.Log[i:]
	if len(st.Log) == 0 {
		st.Count = 0
	}
	return t
}

func (slidingLog) admits(l *descriptors.Limit, st *State, _ int64, hits uint64) bool {
	limit := uint64(l.RequestsPerUnit)
	return hits <= limit && st.Count+hits <= limit
}

func (slidingLog) consume(l *descriptors.Limit, st *State, t int64, hits uint64) {
	if hits == 0 {
		return
	}
	st.Count += hits
	if n := len(st.Log); n > 0 && n >= max(int(l.RequestsPerUnit), 1) {
		st.Log[n-1] = LogEntry{At: t, Hits: st.Log[n-1].Hits + hits}
		return
	}
	st.Log = append(st.Log, LogEntry{At: t, Hits: hits})
}

func (slidingLog) giveBack(_ *descriptors.Limit, st *State, _ int64, hits uint64) {
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

func (slidingLog) remaining(l *descriptors.Limit, st *State, _ int64) uint64 {
	limit := uint64(l.RequestsPerUnit)
	return limit - min(limit, st.Count)
}

func (slidingLog) resetAt(l *descriptors.Limit, st *State, t int64) int64 {
	if len(st.Log) == 0 {
		return t
	}
	return st.Log[0].At + window(l)
}

// retryAt is when enough of the oldest entries have left the window for
// hits to fit: the instant the entry that frees the last needed hit
// leaves.
func (slidingLog) retryAt(l *descriptors.Limit, st *State, t int64, hits uint64) int64 {
	w := window(l)
	limit := uint64(l.RequestsPerUnit)
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

func (slidingLog) expiry(l *descriptors.Limit, st *State) int64 {
	if len(st.Log) == 0 {
		return 0
	}
	return st.Log[len(st.Log)-1].At + window(l)
}
