package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// ReserveRule is Rule with a reserve of estimate hits held for ttl.
func ReserveRule(alg string, rpu uint32, window time.Duration, burst uint32, estimate uint32, ttl time.Duration) *engine.Rule {
	s := engine.Spec{
		Algorithm: alg, Limit: rpu, Unit: engine.Second, Multiplier: uint32(window / time.Second),
		Burst:   engine.Opt[uint32]{V: burst, Set: alg == engine.TokenBucket},
		Reserve: engine.Some(engine.Reserve{Estimate: estimate, TTL: ttl}),
	}
	return engine.MustCompile(s)
}

// calendarReserveRule is CalendarRule with a reserve.
func calendarReserveRule(unit engine.Unit, rpu uint32, estimate uint32, ttl time.Duration) *engine.Rule {
	return engine.MustCompile(engine.Spec{
		Limit: rpu, Unit: unit, Multiplier: 1, Calendar: true, TimeZone: engine.Some("UTC"),
		Reserve: engine.Some(engine.Reserve{Estimate: estimate, TTL: ttl}),
	})
}

// anyRetry marks a denied step whose retry the timeline does not check
// (each algorithm computes its own).
const anyRetry = -1

// resStep is one single-item request of a reservation timeline: a call
// with a reservation id (or none) and its hits, and what the store must
// answer: the verdict, the call's phase and hits held or released, and
// the counter's remaining, held hits and holds after it, and the holds
// that ended by themselves at it.
type resStep struct {
	at         time.Duration // since the timeline's base
	id         string
	hits       uint64
	ok         bool
	phase      engine.Phase
	hold       uint64 // Result.HoldHits
	remaining  uint64
	held       uint64
	holds      uint32
	lapsed     uint32
	lapsedHits uint64
	retry      time.Duration // on denied steps; anyRetry: not checked
}

// reservationSteps: a limit of 30 (a window of an hour, a day, or a
// bucket of 30 tokens an hour), reserves of an estimate of 10 held for
// 30s. Reserves hold the estimate (or the call's hits when more than one)
// and are judged as those hits; a settle below its estimate releases the
// rest, one above charges past its hold (here into what remains, then
// into debt); a second settle charges nothing; a hold never settled ends
// by itself after its ttl (at the next decision on its counter), and its
// late settle charges its hits; an id never seen reserves.
var reservationSteps = []resStep{
	{at: 0, id: "a", hits: 1, ok: true, phase: engine.Reserving, hold: 10, remaining: 20, held: 10, holds: 1},
	{at: sec, id: "b", hits: 1, ok: true, phase: engine.Reserving, hold: 10, remaining: 10, held: 20, holds: 2},
	// 15 hits asked: 15 held if admitted, 20 held + 15 > 30. The retry
	// is no later than a's hold ending by itself (at 30s).
	{at: 2 * sec, id: "c", hits: 15, ok: false, phase: engine.Reserving, remaining: 10, held: 20, holds: 2, retry: 28 * sec},
	// a settles below its estimate: the rest is released.
	{at: 3 * sec, id: "a", hits: 4, ok: true, phase: engine.Settling, hold: 10, remaining: 16, held: 10, holds: 1},
	{at: 4 * sec, id: "a", hits: 4, ok: true, phase: engine.SettledAgain, remaining: 16, held: 10, holds: 1},
	// f settles above its estimate: charged past the limit (debt).
	{at: 5 * sec, id: "f", hits: 1, ok: true, phase: engine.Reserving, hold: 10, remaining: 6, held: 20, holds: 2},
	{at: 6 * sec, id: "f", hits: 18, ok: true, phase: engine.Settling, hold: 10, remaining: 0, held: 10, holds: 1},
	// b's hold ends by itself at 31s: a look (no id) finds it ended.
	{at: 31 * sec, hits: 0, ok: true, remaining: 8, lapsed: 1, lapsedHits: 10},
	{at: 32 * sec, id: "b", hits: 25, ok: true, phase: engine.SettlingUnheld, remaining: 0},
	{at: 33 * sec, id: "b", hits: 25, ok: true, phase: engine.SettledAgain, remaining: 0},
	{at: 34 * sec, id: "d", hits: 1, ok: false, phase: engine.Reserving, remaining: 0, retry: anyRetry},
	// An id never seen (a settle that reached another store) reserves its
	// hits.
	{at: 35 * sec, id: "x", hits: 3, ok: false, phase: engine.Reserving, remaining: 0, retry: anyRetry},
}

// carrySteps: a limit of 30 per window, reserves of 10 for 30s, a hold
// taken 5s before a window ends: the next window starts with it (taken
// again there), until it ends by itself 30s after it was taken; its late
// settle charges the new window; its id is forgotten a ttl later (a call
// then reserves again).
var carrySteps = []resStep{
	{at: 55 * sec, id: "a", hits: 1, ok: true, phase: engine.Reserving, hold: 10, remaining: 20, held: 10, holds: 1},
	{at: 60 * sec, hits: 0, ok: true, remaining: 20, held: 10, holds: 1},
	{at: 85 * sec, hits: 0, ok: true, remaining: 30, lapsed: 1, lapsedHits: 10},
	{at: 86 * sec, id: "a", hits: 7, ok: true, phase: engine.SettlingUnheld, remaining: 23},
	{at: 87 * sec, id: "a", hits: 7, ok: true, phase: engine.SettledAgain, remaining: 23},
	{at: 116 * sec, id: "a", hits: 5, ok: true, phase: engine.Reserving, hold: 5, remaining: 18, held: 5, holds: 1},
}

// testReservations runs the reservation timelines on every algorithm that
// can hold, and the all-or-nothing rule with reservations.
func testReservations(t *testing.T, newStore NewStore) {
	const ttl = 30 * time.Second
	hour := time.Hour
	for _, tc := range []struct {
		name  string
		rule  *engine.Rule
		steps []resStep
		base  time.Duration
	}{
		{"FixedWindow", ReserveRule(engine.FixedWindow, 30, hour, 0, 10, ttl), reservationSteps, 0},
		{"Calendar", calendarReserveRule(engine.Day, 30, 10, ttl), reservationSteps, 0},
		{"SlidingWindow", ReserveRule(engine.SlidingWindow, 30, hour, 0, 10, ttl), reservationSteps, 0},
		{"SlidingLog", ReserveRule(engine.SlidingLog, 30, hour, 0, 10, ttl), reservationSteps, 0},
		{"TokenBucket", ReserveRule(engine.TokenBucket, 30, hour, 30, 10, ttl), reservationSteps, 0},
		{"FixedWindowCarry", ReserveRule(engine.FixedWindow, 30, time.Minute, 0, 10, ttl), carrySteps, 0},
		{"SlidingWindowCarry", ReserveRule(engine.SlidingWindow, 30, time.Minute, 0, 10, ttl), carrySteps, 0},
		{"SlidingLogCarry", ReserveRule(engine.SlidingLog, 30, time.Minute, 0, 10, ttl), carrySteps, 0},
		// A day from midnight UTC: the steps' 60s is midnight.
		{"CalendarCarry", calendarReserveRule(engine.Day, 30, 10, ttl), carrySteps, since(time.UTC, 2027, 1, 16, 0, 0) - time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) { testReservationTimeline(t, newStore, tc.rule, tc.steps, tc.base) })
	}
	t.Run("AllOrNothing", func(t *testing.T) { testReservationAllOrNothing(t, newStore) })
	t.Run("EachCounterItsOwn", func(t *testing.T) { testReservationCounters(t, newStore) })
	t.Run("Reset", func(t *testing.T) { testReservationReset(t, newStore) })
}

// testReservationReset: a Reset forgets a counter's reservations with
// its count: what they held and the ids they knew (a call with a held id
// reserves again).
func testReservationReset(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	desc := uniqueDesc(t, "tenant=acme")
	for _, rule := range []*engine.Rule{
		ReserveRule(engine.FixedWindow, 100, time.Hour, 0, 10, time.Minute),
		ReserveRule(engine.SlidingLog, 100, time.Hour, 0, 10, time.Minute),
	} {
		item := engine.Item{Desc: desc, Rule: rule, Hits: 1, Reservation: "a"}
		if ok, res := apply(t, s, []engine.Item{item}); !ok || res[0].Held != 10 {
			t.Fatalf("%s: reserve: %v %+v", rule.ID, ok, res[0])
		}
		if n, err := s.Reset(context.Background(), []engine.Item{item}); err != nil || n != 1 {
			t.Fatalf("%s: Reset = %d, %v; want 1 counter cleared", rule.ID, n, err)
		}
		if ok, res := apply(t, s, []engine.Item{item}); !ok || res[0].Phase != engine.Reserving || res[0].Held != 10 || res[0].Holds != 1 || res[0].Remaining != 90 {
			t.Errorf("%s: the same id after a Reset: %v %+v; want a reserve again, 10 held of 100", rule.ID, ok, res[0])
		}
	}
}

func testReservationTimeline(t *testing.T, newStore NewStore, rule *engine.Rule, steps []resStep, base time.Duration) {
	clock := NewClock(T0.Add(base))
	s := newStore(t, clock.Now)
	desc := uniqueDesc(t, "tenant=acme")
	for i, st := range steps {
		clock.Set(T0.Add(base + st.at))
		items := []engine.Item{{Desc: desc, Rule: rule, Hits: st.hits, Reservation: st.id}}
		results := make([]engine.Result, 1)
		call := fmt.Sprintf("step %d: Apply(%s %d/%s, T0+%v, id %q, hits=%d)", i, rule.Algorithm(), rule.Limit, rule.Window, base+st.at, st.id, st.hits)
		ok, err := s.Apply(context.Background(), items, results)
		if err != nil {
			t.Fatalf("%s: %v", call, err)
		}
		r := results[0]
		if ok != st.ok || r.Admitted != st.ok {
			t.Fatalf("%s = %v (item %v), want %v: %+v", call, ok, r.Admitted, st.ok, r)
		}
		got := resStep{at: st.at, id: st.id, hits: st.hits, ok: ok, phase: r.Phase, hold: r.HoldHits, remaining: r.Remaining,
			held: r.Held, holds: r.Holds, lapsed: r.Lapsed, lapsedHits: r.LapsedHits, retry: st.retry}
		if !st.ok && st.retry != anyRetry {
			got.retry = r.RetryAfter
		}
		if got != st {
			t.Errorf("%s = %+v\nwant %+v", call, got, st)
		}
	}
}

// testReservationAllOrNothing: a reserve is all-or-nothing with the
// request's other limits: denied by a second window of its descriptor,
// or by another descriptor, it holds nothing. A settle is not: it
// releases its hold and charges its hits whatever the request's verdict.
func testReservationAllOrNothing(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	desc, other := uniqueDesc(t, "tenant=acme"), uniqueDesc(t, "ip=1")
	tokens := ReserveRule(engine.FixedWindow, 100, time.Hour, 0, 10, time.Minute)
	perMinute := Rule(engine.FixedWindow, 2, time.Minute, 0) // requests, no reserve
	perIP := Rule(engine.FixedWindow, 1, time.Minute, 0)
	call := func(id string, hits uint64) []engine.Item {
		return []engine.Item{
			{Desc: desc, Rule: tokens, Hits: hits, Reservation: id},
			{Desc: desc, Rule: perMinute, Hits: hits, Reservation: id},
		}
	}
	type want struct {
		ok     bool
		phase  engine.Phase
		tokens uint64 // the token limit's remaining
		held   uint64
	}
	for i, step := range []struct {
		items []engine.Item
		want  want
	}{
		{call("a", 1), want{true, engine.Reserving, 90, 10}},
		{call("b", 1), want{true, engine.Reserving, 80, 20}},
		// The requests' window denies: c holds nothing.
		{call("c", 1), want{false, engine.Reserving, 80, 20}},
		// Another descriptor denies: d holds nothing.
		{append(call("d", 1), engine.Item{Desc: other, Rule: perIP, Hits: 2}), want{false, engine.Reserving, 80, 20}},
		// a settles with 30 tokens: the requests' window denies 30 hits
		// (never: more than its limit), and the settle counts all the same.
		{call("a", 30), want{false, engine.Settling, 60, 10}},
		{call("a", 30), want{false, engine.SettledAgain, 60, 10}},
	} {
		ok, res := apply(t, s, step.items)
		got := want{ok, res[0].Phase, res[0].Remaining, res[0].Held}
		if got != step.want {
			t.Fatalf("step %d: Apply(%d items, id %q) = %+v, want %+v\nresults %+v", i, len(step.items), step.items[0].Reservation, got, step.want, res)
		}
		if !ok && res[0].Phase == engine.Reserving && res[0].HoldHits != 0 {
			t.Errorf("step %d: a denied reserve reports %d hits held", i, res[0].HoldHits)
		}
	}
	// c and d hold nothing: they reserve now.
	clock.Set(T0.Add(time.Minute))
	for _, id := range []string{"c", "d"} {
		if ok, res := apply(t, s, call(id, 1)[:1]); !ok || res[0].Phase != engine.Reserving {
			t.Errorf("Apply(id %q) after its denied reserve = %v %+v, want a reserve admitted", id, ok, res[0])
		}
	}
}

// testReservationCounters: each counter keeps its own reservations: a
// limit added to a descriptor (by a reload) since a reserve reserves at
// the settle, while the limit that held settles; and the same counter
// twice in a request reserves or settles once.
func testReservationCounters(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	desc := uniqueDesc(t, "tenant=acme")
	hourly := ReserveRule(engine.FixedWindow, 100, time.Hour, 0, 10, time.Minute)
	daily := ReserveRule(engine.SlidingLog, 1000, 24*time.Hour, 0, 10, time.Minute)
	if ok, res := apply(t, s, []engine.Item{{Desc: desc, Rule: hourly, Hits: 1, Reservation: "a"}, {Desc: desc, Rule: hourly, Hits: 1, Reservation: "a"}}); !ok ||
		res[0].Phase != engine.Reserving || res[0].Held != 10 || res[1].Phase != engine.NotReserving || !res[1].Admitted || res[1].Held != 10 {
		t.Fatalf("one counter twice, one id: %v %+v; want one hold of 10, the repeat admitted without a phase", ok, res)
	}
	ok, res := apply(t, s, []engine.Item{{Desc: desc, Rule: hourly, Hits: 7, Reservation: "a"}, {Desc: desc, Rule: daily, Hits: 7, Reservation: "a"}})
	if !ok || res[0].Phase != engine.Settling || res[0].Remaining != 93 || res[1].Phase != engine.Reserving || res[1].HoldHits != 7 || res[1].Remaining != 993 {
		t.Fatalf("a settle reaching a limit added since its reserve: %v %+v; want the hourly settled (93 remaining), the daily holding the call's 7 hits (993)", ok, res)
	}
}
