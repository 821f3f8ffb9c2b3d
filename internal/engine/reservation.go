package engine

import (
	"container/heap"
	"strings"
	"time"
)

// Reservations hold hits of a counter for one request until it settles:
// the LLM token budget's two calls, a reserve when the request comes (an
// estimate of its tokens) and a settle when its stream ends (the tokens
// used). A reservation is a grant (package grant) whose holder is the
// store itself, in the grant's words:
//
//   - reserve is a take: the first call with an id takes its hold (the
//     estimate, or the call's hits when it gives more than one) from the
//     counter, judged as a decision of that many hits, all-or-nothing with
//     the request's other limits; a take the store denies holds nothing;
//   - the hold is held: counted in the counter (a window's count, a log's
//     count, a bucket's TAT), so that every later decision judges used +
//     held + its own hits, and limit_remaining never overstates what a new
//     reserve can take;
//   - settle spends the hold: a later call with the same id releases it
//     (hits back to the counter they were counted on, landed at once: the
//     release is part of the same store call) and charges the call's
//     hits, whether or not they fit (debt, as count_denied_hits): what the
//     request used beyond its hold is the one term that may pass the limit;
//   - a hold not settled within its ttl is released by itself (charging
//     nothing), at the first decision on its counter after that instant;
//   - a window's holds are taken again in each window they live into (its
//     count starts at the hits held): the hits of the window they were
//     taken in lapse there, as a grant's do at its window's end. A sliding
//     window carries them out of its previous window's count, a bucket and
//     a log need nothing (their holds are in the TAT, or beside the log).
//
// So for one counter and one window, with every term counted in that
// window (TestReservationLedger checks it on seeded random schedules
// against the reference store):
//
//	count = hits admitted without a reservation + hits charged by settles
//	        + hits held + hits of holds that lapsed in it (released later
//	        in another window, or by the window's end)
//
// and since a hold is judged as hits of the counter when taken, the hits
// a window charges pass the limit by at most what settles charged beyond
// their holds: the sum of (actual − estimate)+ over the requests in
// flight, 0 when the estimate is an upper bound.
//
// The table (Holds) is per counter and lives in its State, so that every
// store keeps it where it keeps the counter (memory: in process; Redis: a
// hash and a sorted set beside the counter, changed in the same script
// call, see the Redis store's scripts/decide/reserve.lua). A reservation's
// id is remembered for a ttl after its hold ends (settled, or released by
// itself): a second settle then charges nothing, a late settle of a hold
// released by itself charges its hits; past that, the id is new again.
//
// Which algorithms can hold: the windows (fixed, calendar, sliding), the
// sliding log and the token bucket (canHold). A concurrency limit cannot:
// its acquisitions are already holds, released by a refund or lease_ttl.

// Reserve is a limit's reserve: {estimate, ttl}. Not part of the counter's
// identity: a limit with and without it counts on one counter.
type Reserve struct {
	// Estimate is the hits a reserve holds when the call asks for at most
	// one (a call that asks for more holds its own hits).
	Estimate uint32
	// TTL is how long a hold lasts when nothing settles it; its id is
	// remembered as long again after its hold ends.
	TTL time.Duration
}

// MaxReserveTTL bounds a reserve's ttl.
const MaxReserveTTL = 24 * time.Hour

// Phase is what a reservation call was (Result.Phase), as its store found
// its id.
type Phase uint8

// The phases of a reservation call.
const (
	// NotReserving: not a reservation call (no id, no reserve on its
	// limit, or a refund).
	NotReserving Phase = iota
	// Reserving: the id was not known: judged as HoldHits hits, held when
	// the request is admitted.
	Reserving
	// Settling: the id held hits (HoldHits), released; the call's hits
	// are charged.
	Settling
	// SettledAgain: the id was settled already: nothing is charged.
	SettledAgain
	// SettlingUnheld: the id's hold was released by itself (its ttl
	// passed): the call's hits are charged.
	SettlingUnheld
)

var phaseNames = [...]string{"none", "reserve", "settle", "settled_again", "settle_unheld"}

func (p Phase) String() string { return phaseNames[p] }

// compileReserve checks s.Reserve into r.
func compileReserve(s *Spec, r *Rule, errs *specErrors) {
	if !s.Reserve.Set {
		return
	}
	res := s.Reserve.V
	switch {
	case !r.alg.canHold():
		errs.add("reserve", true, "reserve is for algorithms %s; not %s, %s", HoldingAlgorithms(), r.alg.name(), r.alg.whyNoHold())
		return
	case s.Lease:
		errs.add("reserve", true, "reserve is not for lease: true limits: a hold lives in the store until its settle, which a slice decided in process cannot see")
		return
	case res.Estimate == 0:
		errs.add("reserve", false, "reserve's estimate must be at least 1")
		return
	case res.TTL < time.Millisecond || res.TTL > MaxReserveTTL:
		errs.add("reserve", false, "reserve's ttl %s is not between 1ms and 24h", res.TTL)
		return
	case res.TTL%time.Millisecond != 0:
		errs.add("reserve", false, "reserve's ttl %s is not a whole number of milliseconds", res.TTL)
		return
	}
	if c := r.alg.capacity(r); c > 0 && uint64(res.Estimate) > c {
		errs.add("reserve", false, "reserve's estimate %d is more than the limit admits at once (%d): every reservation would be denied", res.Estimate, c)
		return
	}
	r.Reserve = &res
}

// HoldingAlgorithms names the algorithms that Spec.Reserve allows, as
// configs write them.
func HoldingAlgorithms() string {
	var names []string
	for _, a := range algorithms {
		switch _, isForm := a.(form); {
		case isForm || !a.canHold():
		case a.name() == FixedWindow:
			names = append(names, FixedWindow+" (calendar: true too)")
		default:
			names = append(names, a.name())
		}
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// ReserveArg is r's reserve as the Redis scripts take it: the estimate and
// the ttl in µs joined by ':' ("" for none).
func (r *Rule) ReserveArg() string {
	if r.Reserve == nil {
		return ""
	}
	return uitoa(uint64(r.Reserve.Estimate)) + ":" + uitoa(uint64(r.Reserve.TTL.Microseconds()))
}

// Reserving reports whether it is a reservation call: its rule reserves,
// it carries an id, and it is not a refund (which gives hits back as any
// refund, whatever its id).
func (it *Item) Reserving() bool {
	return it.Reservation != "" && it.Rule.Reserve != nil && !it.Refund
}

// holdHits are the hits a reserve of it holds: its own when more than
// one, else its rule's estimate.
func (it *Item) holdHits() uint64 {
	if it.Hits > 1 {
		return it.Hits
	}
	return uint64(it.Rule.Reserve.Estimate)
}

// Holds is the reservation table of one counter: its reservations by id,
// held or remembered, each with the instant of its next event (its hold's
// end, or when it is forgotten). The zero value is empty; a State holds a
// *Holds, nil for none, which Clone copies. Not safe for concurrent use.
type Holds struct {
	byID   map[string]*holdRecord
	events holdEvents // by (next, id), earliest first
	live   uint32     // records holding hits
	last   int64      // the latest instant a record is forgotten (an upper bound)
}

// holdRecord is one reservation of a counter.
type holdRecord struct {
	id    string
	hits  uint64 // held (recordHeld); 0 otherwise
	at    int64  // reserved at (µs, the counter's instant)
	until int64  // its hold ends at (at + ttl); it is forgotten a ttl later
	state uint8  // recordHeld, recordSettled, recordLapsed
	index int    // in events
}

const (
	recordHeld    = 0
	recordSettled = 1
	recordLapsed  = 2
)

// next is the instant of the record's next event: its hold's end while
// it holds, else the instant it is forgotten.
func (h *holdRecord) next() int64 {
	if h.state == recordHeld {
		return h.until
	}
	return h.forget()
}

// forget is when the record is forgotten: a ttl after its hold's end.
func (h *holdRecord) forget() int64 { return h.until + (h.until - h.at) }

// holdEvents is a heap of records by their next event, ties by id (the
// order of the Redis store's sorted set).
type holdEvents []*holdRecord

func (e holdEvents) Len() int { return len(e) }
func (e holdEvents) Less(i, j int) bool {
	a, b := e[i].next(), e[j].next()
	return a < b || a == b && e[i].id < e[j].id
}
func (e holdEvents) Swap(i, j int) {
	e[i], e[j] = e[j], e[i]
	e[i].index, e[j].index = i, j
}
func (e *holdEvents) Push(x any) {
	h := x.(*holdRecord)
	h.index = len(*e)
	*e = append(*e, h)
}
func (e *holdEvents) Pop() any {
	old := *e
	h := old[len(old)-1]
	old[len(old)-1] = nil
	*e = old[:len(old)-1]
	return h
}

// MaxSweep bounds the events one decision handles on one counter (the
// Redis store's the same): the others wait for the next decision, holding
// their hits meanwhile (never fewer held than true).
const MaxSweep = 128

// clone returns a copy of hs that shares nothing with it.
func (hs *Holds) clone() *Holds {
	if hs == nil {
		return nil
	}
	c := &Holds{byID: make(map[string]*holdRecord, len(hs.byID)), events: make(holdEvents, len(hs.events)), live: hs.live, last: hs.last}
	for i, h := range hs.events {
		cp := *h
		c.events[i] = &cp
		c.byID[cp.id] = &cp
	}
	return c
}

// NextEvent returns the instant of the table's next event (0 for none):
// what a retry instant may not pass while holds are held (one may end
// then).
func (hs *Holds) nextEvent() int64 {
	if hs == nil || len(hs.events) == 0 {
		return 0
	}
	return hs.events[0].next()
}

// expiry returns the instant from which hs holds nothing worth keeping
// (0: already).
func (hs *Holds) expiry() int64 {
	if hs == nil || len(hs.events) == 0 {
		return 0
	}
	return hs.last
}

// Live returns the holds held now, and the age at t (µs) of the oldest.
func (hs *Holds) oldest(t int64) (n uint32, age time.Duration) {
	if hs == nil {
		return 0, 0
	}
	first := int64(-1)
	for _, h := range hs.events {
		if h.state == recordHeld && (first < 0 || h.at < first) {
			first = h.at
		}
	}
	if first < 0 {
		return hs.live, 0
	}
	return hs.live, micros(t - first)
}

// Bytes is about the memory hs takes (its records, their ids, the map's
// and the heap's slots), for stores that bound their memory.
func (hs *Holds) Bytes() int64 {
	if hs == nil {
		return 0
	}
	n := int64(64)
	for _, h := range hs.events {
		n += 112 + int64(len(h.id))
	}
	return n
}

// find returns the record of id, nil for none.
func (hs *Holds) find(id string) *holdRecord {
	if hs == nil {
		return nil
	}
	return hs.byID[id]
}

// add records a reservation of id at t (µs) for ttl, in state, holding
// hits.
func (st *State) addHold(id string, hits uint64, t int64, ttl time.Duration, state uint8) {
	if st.Holds == nil {
		st.Holds = &Holds{byID: make(map[string]*holdRecord)}
	}
	hs := st.Holds
	// The id may alias a caller's buffer: the table keeps a copy.
	h := &holdRecord{id: strings.Clone(id), hits: hits, at: t, until: t + ttl.Microseconds(), state: state}
	hs.byID[id] = h
	heap.Push(&hs.events, h)
	hs.last = max(hs.last, h.forget())
	if state == recordHeld {
		hs.live++
		st.Held += hits
	}
}

// endHold ends the hold of h (settled or lapsed): its hits go back to the
// counter (the algorithm's unhold, at the counter's instant t).
func (st *State) endHold(r *Rule, h *holdRecord, t int64, state uint8) {
	hits := h.hits
	r.alg.unhold(r, st, t, hits)
	st.Held -= min(st.Held, hits)
	st.Holds.live--
	h.hits, h.state = 0, state
	heap.Fix(&st.Holds.events, h.index)
}

// sweep handles the table's events due at the counter's instant t (at
// most MaxSweep, earliest first): a hold whose ttl has passed is released
// by itself (it lapses: recordLapsed, remembered a ttl more), a record
// past that is forgotten. It returns the holds released and their hits.
// A hold found only once it would be forgotten too (no decision on the
// counter for a ttl after its end) is released and forgotten at once, not
// counted: a store that forgets a whole counter at its expiry (memstore's
// sweeper, Redis's key expiry) cannot count it either. Part of normalizing
// a state: kept whatever the decision's outcome.
func (r *Rule) sweep(st *State, t int64) (lapsed uint32, hits uint64) {
	hs := st.Holds
	if hs == nil {
		return 0, 0
	}
	var dueBuf [16]*holdRecord
	due := dueBuf[:0]
	for len(hs.events) > 0 && len(due) < MaxSweep && hs.events[0].next() <= t {
		due = append(due, heap.Pop(&hs.events).(*holdRecord))
	}
	for _, h := range due {
		switch {
		case h.state != recordHeld:
			delete(hs.byID, h.id)
		case h.forget() <= t:
			// Ended and forgotten since the last decision on the counter:
			// its hits go back, uncounted (as when a store forgets the
			// whole counter at its expiry).
			heap.Push(&hs.events, h)
			st.endHold(r, h, t, recordLapsed)
			heap.Remove(&hs.events, h.index)
			delete(hs.byID, h.id)
		default:
			heap.Push(&hs.events, h)
			lapsed++
			hits += h.hits
			st.endHold(r, h, t, recordLapsed)
		}
	}
	if len(hs.events) == 0 {
		st.Holds = nil
	}
	return lapsed, hits
}

// A decision's reservation calls, in phases: phases finds each call's
// phase once the counters are normalized (and their due events swept);
// the judging pass judges a reserve as its hold's hits and admits a
// settle; reserveAndSettle, once the request's outcome is known, records
// the holds of an admitted request's reserves and settles the settles,
// whatever the outcome.

// phases sets results[i].Phase for each reservation call of items, from
// its counter's table: a call whose id the counter does not know
// reserves, one whose id it holds settles. A later call of the request on
// a counter that an earlier one with the same id reached does nothing
// (dup[i] set, its phase NotReserving). Each counter decides for itself:
// the counters of a descriptor may sit on two stores (a per-second Redis),
// and a limit that a reload added since a reserve reserves at its settle.
func phases(items []Item, states []*State, results []Result, dup []bool) {
	for i := range items {
		it := &items[i]
		if !it.Reserving() {
			continue
		}
		for j := range i {
			if items[j].Reserving() && states[j] == states[i] && items[j].Reservation == it.Reservation {
				dup[i] = true
			}
		}
		if dup[i] {
			continue
		}
		r := &results[i]
		switch h := states[i].Holds.find(it.Reservation); {
		case h == nil:
			r.Phase = Reserving
		case h.state == recordHeld:
			r.Phase = Settling
		case h.state == recordSettled:
			r.Phase = SettledAgain
		default:
			r.Phase = SettlingUnheld
		}
	}
}

// reserveAndSettle records the holds of the reserves that an admitted
// request consumed (not in a quota group that is over), and settles the
// settles whatever the outcome: a held hold is released and the call's
// hits charged past the limit if need be; an unheld one charges them and
// is remembered as settled; a settled one charges nothing.
func reserveAndSettle(items []Item, states []*State, results []Result, times []int64, dup []bool, admitted bool, over map[int32]bool) {
	for i := range items {
		it, r := &items[i], &results[i]
		if r.Phase == NotReserving || dup[i] {
			continue
		}
		st, tc, rule := states[i], times[i], it.Rule
		switch r.Phase {
		case Reserving:
			if admitted && r.Admitted && !over[it.Group] {
				r.HoldHits = it.holdHits()
				st.addHold(it.Reservation, r.HoldHits, tc, rule.Reserve.TTL, recordHeld)
			}
		case Settling:
			h := st.Holds.find(it.Reservation)
			r.HoldHits = h.hits
			st.endHold(rule, h, tc, recordSettled)
			rule.alg.consume(rule, st, tc, it.Hits)
		case SettlingUnheld:
			st.Holds.find(it.Reservation).state = recordSettled // its next event, when it is forgotten, stays
			rule.alg.consume(rule, st, tc, it.Hits)
		}
	}
}

// judgedHits are the hits the judging pass judges item it by: a reserve's
// hold, none for a settle (which it admits), else its own.
func judgedHits(it *Item, r *Result, dup bool) uint64 {
	switch {
	case dup || r.Phase > Reserving:
		return 0
	case r.Phase == Reserving:
		return it.holdHits()
	}
	return it.Hits
}

// holdStatus writes into r the reservations of the counter st of rule
// (held hits and holds) as the decision left it, and with oldest (Peek)
// the age of the oldest hold at t.
func holdStatus(rule *Rule, st *State, t int64, r *Result, oldest bool) {
	if rule.Reserve == nil {
		return
	}
	r.Held = st.Held
	if oldest {
		r.Holds, r.OldestHold = st.Holds.oldest(t)
	} else if st.Holds != nil {
		r.Holds = st.Holds.live
	}
}
