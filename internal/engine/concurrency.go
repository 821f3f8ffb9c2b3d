package engine

import "time"

// concurrency limits the requests in flight (algorithm: concurrency): hits
// acquire slots, a refund (is_negative_hits) releases them, and a slot
// that no release frees is freed by itself lease_ttl after its
// acquisition. It is a sliding log whose window is the lease_ttl, and it
// embeds slidingLog for everything but its name, code, checks, identity
// and consume. State: a sliding log's, Log the acquisitions still held (their
// instant and hits), oldest first, and Count their hits. Requests per unit
// is the most hits held at once; the unit is required, as for any limit,
// and means nothing more: Rule.Window is the lease_ttl, which the log's
// expiry, Reset and RetryAfter count with.
//
// A release carries no identity: it gives back the newest acquisitions
// (slidingLog.giveBack). That is the one order that keeps the promise that
// an acquisition never released holds its slot at most lease_ttl: whichever
// acquisition a release was really for, the entries left are never newer
// than those still truly held, so none outlives its own lease. Any other
// order can hand a lost acquisition's slot on to newer and newer entries
// under steady traffic, for ever. The price: when requests end out of
// order, a request still in flight may be counted by an older entry, which
// expires before its own lease would (the limit then admits more than it
// holds until the releases catch up); a lease_ttl above the longest
// request keeps that rare.
//
// When the log holds as many entries as the limit, hits beyond it (hits
// counted when denied, a limit lowered by a reload) go into the newest
// entry, as in a sliding log, but at that entry's instant (consume). The
// Redis script's concurrency section is its log section with that consume.
type concurrency struct{ slidingLog }

// Concurrency is the algorithm's name (Spec.Algorithm).
const Concurrency = "concurrency"

func (concurrency) name() string { return Concurrency }
func (concurrency) code() uint8  { return 5 }

// compile requires lease_ttl, a whole number of milliseconds from 1ms to
// 100 years, which becomes the rule's window; the limit is bounded as a
// sliding log's.
func (a concurrency) compile(s *Spec, r *Rule, errs *specErrors) algorithm {
	noBurst(s, r, errs)
	if r.Limit > MaxSlidingLog {
		errs.add("requests_per_unit", false, "requests_per_unit %d is too large for concurrency (at most %d: it keeps one entry per acquisition)",
			r.Limit, MaxSlidingLog)
	}
	switch ttl := s.LeaseTTL.V; {
	case !s.LeaseTTL.Set:
		errs.add("lease_ttl", false, "lease_ttl is required for algorithm concurrency: how long an acquisition that is never released holds its slot (a duration such as 30s)")
	case ttl < time.Millisecond || ttl > MaxWindow:
		errs.add("lease_ttl", false, "lease_ttl %s is not between 1ms and 100 years", ttl)
	case ttl%time.Millisecond != 0:
		errs.add("lease_ttl", false, "lease_ttl %s is not a whole number of milliseconds", ttl)
	default:
		r.Window = ttl
	}
	return a
}

// noLeaseTTL refuses lease_ttl on the algorithms other than concurrency.
func noLeaseTTL(s *Spec, alg algorithm, errs *specErrors) {
	if s.LeaseTTL.Set && !alg.inFlight() {
		errs.add("lease_ttl", true, "lease_ttl is only for algorithm concurrency, not %s", configName(alg))
	}
}

// A concurrency limit cannot hold for a reservation: its acquisitions are
// holds already, each released by a refund or by lease_ttl.
func (concurrency) canHold() bool { return false }
func (concurrency) whyNoHold() string {
	return "whose acquisitions are holds already (released by is_negative_hits or lease_ttl)"
}

// counterID is "cc": neither the lease_ttl nor the unit is part of the
// counter, so a reload that changes them keeps the acquisitions in flight
// (they then expire by the new lease_ttl).
func (concurrency) counterID(*Rule) string { return "cc" }

// It counts requests in flight, and its Window, the lease_ttl, is not part
// of its ID.
func (concurrency) inFlight() bool         { return true }
func (concurrency) windowInIdentity() bool { return false }

// consume logs hits as a sliding log does, except that hits beyond the
// limit's entries join the newest entry without giving it their instant.
// With count_denied_hits a denied request's hits are charged so, and its
// release (Envoy sends one for a denied request too) takes them back off
// the newest entry: had they moved it to their instant, each denial while
// the limit is full would renew the newest acquisition's lease, and one
// whose release is lost could hold its slot for twice the lease_ttl. Hits
// whose own release is lost leave with that entry, sooner than their
// lease: a slot is never held longer, as the release order promises.
func (concurrency) consume(r *Rule, st *State, t int64, hits uint64) {
	if hits == 0 {
		return
	}
	st.Count += hits
	if n := len(st.Log); n > 0 && n >= max(int(r.Limit), 1) {
		st.Log[n-1] = LogEntry{At: st.Log[n-1].At, Hits: st.Log[n-1].Hits + hits}
		return
	}
	st.Log = append(st.Log, LogEntry{At: t, Hits: hits})
}
