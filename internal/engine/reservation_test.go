package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/grant"
	"github.com/rlsproject/rls/internal/engine/storetest"
)

// TestReservationLedger drives reservations against the reference store
// on seeded random schedules and books each one as a grant (package
// grant): a reserve takes its hold, a window's turn lapses the holds held
// in the window that ends and takes them again in the next, a settle
// spends min(actual, hold) and releases the rest (landed at once: the
// same store call), and charges what it used beyond (debt), a hold whose
// ttl passes is released. After every step, in the store's current
// window,
//
//	store count = hits admitted without a reservation + charged beyond holds
//	              + charged without a hold (it ended by itself) + spent from
//	              holds + held
//
// each term counting the hits of that window, and for every window the
// grant's own identity (taken = spent + held + released + lapsed) and the
// ledger's sums; the holds that the store says ended by themselves are
// the model's. And the bound that reservations promise: the hits a window
// charged (admitted, spent and beyond) pass its limit by at most what
// settles charged beyond their holds; by nothing when no settle is above
// its estimate (the schedules with upper-bound estimates).
func TestReservationLedger(t *testing.T) {
	seed := storetest.Seed(t)
	const runs, steps = 200, 1500
	var sum reservationTally
	for run := range runs {
		sum.add(runReservationSchedule(t, seed+uint64(run), steps, run%2 == 0))
		if t.Failed() {
			return
		}
	}
	t.Logf("seeds %d to %d: %d reserves held (%d denied), %d settled (%d above their hold, %d again, %d unheld), %d ended by themselves (%d uncounted), %d window turns with holds, %d plain hits",
		seed, seed+runs-1, sum.reserves, sum.denied, sum.settles, sum.above, sum.again, sum.unheld, sum.lapses, sum.forgotten, sum.turns, sum.plain)
	if sum.settles == 0 || sum.above == 0 || sum.again == 0 || sum.unheld == 0 || sum.lapses == 0 || sum.forgotten == 0 || sum.turns == 0 || sum.denied == 0 {
		t.Errorf("seed %d: the schedules left a move out (%+v): they test too little of reservations", seed, sum)
	}
}

type reservationTally struct {
	reserves, denied, settles, above, again, unheld, lapses, forgotten, turns, plain int
}

func (a *reservationTally) add(b reservationTally) {
	a.reserves += b.reserves
	a.denied += b.denied
	a.settles += b.settles
	a.above += b.above
	a.again += b.again
	a.unheld += b.unheld
	a.lapses += b.lapses
	a.forgotten += b.forgotten
	a.turns += b.turns
	a.plain += b.plain
}

// modelHold is one reservation as the schedule knows it.
type modelHold struct {
	id        string
	hits      uint64
	at, until time.Time
	state     string // "held", "settled", "lapsed"
	g         grant.Grant
}

func runReservationSchedule(t *testing.T, seed uint64, steps int, upperBound bool) reservationTally {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0x7e5e))
	clock := storetest.NewClock(storetest.T0.Add(time.Duration(r.IntN(1_000_000)) * time.Microsecond))
	store := &reference{now: clock.Now, states: make(map[[2]string]*engine.State)}
	const limit, estimate = 100, 8
	ttl := []time.Duration{300 * time.Millisecond, 900 * time.Millisecond, 2500 * time.Millisecond}[r.IntN(3)]
	rule := engine.MustCompile(engine.Spec{Unit: engine.Second, Multiplier: 1, Limit: limit, Reserve: engine.Some(engine.Reserve{Estimate: estimate, TTL: ttl})})
	far := storetest.T0.Add(1000 * time.Hour) // a reservation's grant has no window of its own: it is taken again in each
	var ledger grant.Ledger
	// The books of a window: hits admitted without a reservation, charged
	// by settles beyond their holds and by settles without one (their
	// hold ended by itself), spent from holds, and the grant's terms.
	type books struct{ plain, beyond, unheld, spent, taken, released, lapsed uint64 }
	byWindow := map[int64]*books{}
	book := func(w int64) *books {
		if byWindow[w] == nil {
			byWindow[w] = &books{}
		}
		return byWindow[w]
	}
	window := func(at time.Time) int64 { return at.UnixMicro() / time.Second.Microseconds() }
	holds := map[string]*modelHold{}
	var ids []string
	var tally reservationTally
	seen := window(clock.Now()) // the window the store's counter is in
	ctx := context.Background()
	fail := func(step int, what, format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (RLS_TEST_SEED=%d replays it, upper bound %v): step %d (%s, T0+%v): %s", seed, seed, upperBound, step, what,
			clock.Now().Sub(storetest.T0), fmt.Sprintf(format, args...))
	}
	call := func(id string, hits uint64) (bool, engine.Result) {
		items := []engine.Item{{Desc: "llm/tenant=acme", Rule: rule, Hits: hits, Reservation: id}}
		res := make([]engine.Result, 1)
		ok, err := store.Apply(ctx, items, res)
		if err != nil {
			t.Fatal(err)
		}
		return ok, res[0]
	}
	held := func() (n uint64) {
		for _, h := range holds {
			if h.state == "held" {
				n += h.hits
			}
		}
		return n
	}
	// decided is what the model does at every decision: the window the
	// counter turns into takes the holds again (their old window's
	// lapse), then the holds whose ttl passed are released (or forgotten
	// at once, uncounted, past a ttl more); res says what the store found.
	decided := func(step int, what string, res engine.Result) {
		now := clock.Now()
		w := window(now)
		if w > seen {
			if n := held(); n > 0 {
				tally.turns++
			}
			for _, h := range holds {
				if h.state == "held" {
					before := ledger.Counts().Lapsed
					ledger.Lapse(&h.g)
					book(seen).lapsed += ledger.Counts().Lapsed - before
					ledger.Take(&h.g, now, h.hits, far)
					book(w).taken += h.hits
				}
			}
			seen = w
		}
		var lapsed uint32
		var lapsedHits uint64
		for _, h := range holds {
			if h.state != "held" || h.until.After(now) {
				continue
			}
			released := ledger.Release(&h.g, now, 0)
			ledger.Landed(released, true)
			book(w).released += released
			if !now.Before(h.until.Add(h.until.Sub(h.at))) {
				delete(holds, h.id) // forgotten at once
				tally.forgotten++
				continue
			}
			h.state = "lapsed"
			lapsed++
			lapsedHits += released
			tally.lapses++
		}
		if res.Lapsed != lapsed || res.LapsedHits != lapsedHits {
			fail(step, what, "the store says %d holds (%d hits) ended by themselves; the model %d (%d hits)", res.Lapsed, res.LapsedHits, lapsed, lapsedHits)
		}
		for id, h := range holds {
			if h.state != "held" && !now.Before(h.until.Add(h.until.Sub(h.at))) {
				delete(holds, id)
			}
		}
	}

	for step := range steps {
		now := clock.Now()
		var what string
		switch x := r.IntN(100); {
		case x < 30: // a reserve: a new id
			what = "reserve"
			id := fmt.Sprintf("r%d", step)
			hits := uint64(1)
			if r.IntN(4) == 0 {
				hits = uint64(2 + r.IntN(20)) // the call's own hits (a max_tokens)
			}
			hold := max(hits, 1)
			if hits <= 1 {
				hold = estimate
			}
			// The model's count before the call: what the store will judge.
			w := window(now)
			ok, res := call(id, hits)
			decided(step, what, res)
			b := book(w)
			want := b.plain+b.beyond+b.unheld+b.spent+held()+hold <= limit
			if ok != want || res.Phase != engine.Reserving {
				fail(step, what, "reserve of %d: admitted %v phase %s, the model says %v", hold, ok, res.Phase, want)
			}
			if !ok {
				tally.denied++
				break
			}
			if res.HoldHits != hold {
				fail(step, what, "held %d, want %d", res.HoldHits, hold)
			}
			h := &modelHold{id: id, hits: hold, at: now, until: now.Add(ttl), state: "held"}
			ledger.Take(&h.g, now, hold, far)
			b.taken += hold
			holds[id] = h
			ids = append(ids, id)
			tally.reserves++
		case x < 60 && len(ids) > 0: // a settle of a known id
			what = "settle"
			id := ids[len(ids)-1-r.IntN(min(len(ids), 12))] // a recent one, most likely still held
			h := holds[id]
			var actual uint64
			if h != nil && h.hits > 0 {
				actual = uint64(r.Int64N(int64(h.hits) + 1)) // at most the hold: an upper-bound estimate
			}
			if !upperBound && r.IntN(3) == 0 {
				actual = uint64(r.IntN(3 * estimate))
			}
			ok, res := call(id, actual)
			decided(step, what, res) // the store's sweep comes first
			w := window(clock.Now())
			b := book(w)
			state := "forgotten"
			if h = holds[id]; h != nil {
				state = h.state
			}
			switch state {
			case "held":
				if !ok || res.Phase != engine.Settling || res.HoldHits != h.hits {
					fail(step, what, "settle of %d on a hold of %d: %v %s holding %d", actual, h.hits, ok, res.Phase, res.HoldHits)
				}
				spend := min(actual, h.hits)
				if !ledger.Spend(&h.g, clock.Now(), spend) {
					fail(step, what, "the ledger holds %d, cannot spend %d", h.g.Left(), spend)
				}
				released := ledger.Release(&h.g, clock.Now(), 0)
				ledger.Landed(released, true)
				b.spent += spend
				b.released += released
				b.beyond += actual - spend
				h.state = "settled"
				tally.settles++
				if actual > h.hits {
					tally.above++
				}
			case "settled":
				if !ok || res.Phase != engine.SettledAgain {
					fail(step, what, "a second settle: %v %s", ok, res.Phase)
				}
				tally.again++
			case "lapsed":
				if !ok || res.Phase != engine.SettlingUnheld {
					fail(step, what, "a settle of a hold ended by itself: %v %s", ok, res.Phase)
				}
				b.unheld += actual // nothing held
				h.state = "settled"
				tally.unheld++
			default: // forgotten: a reserve again, as any unknown id
				if res.Phase != engine.Reserving {
					fail(step, what, "a call of a forgotten id: %s, want a reserve", res.Phase)
				}
				if ok {
					hold := max(actual, 1)
					if actual <= 1 {
						hold = estimate
					}
					nh := &modelHold{id: id, hits: hold, at: clock.Now(), until: clock.Now().Add(ttl), state: "held"}
					ledger.Take(&nh.g, clock.Now(), hold, far)
					b.taken += hold
					holds[id] = nh
				}
			}
		case x < 75: // a plain call: no id
			what = "plain"
			hits := uint64(r.IntN(6))
			w := window(now)
			ok, res := call("", hits)
			decided(step, what, res)
			b := book(w)
			if ok {
				b.plain += hits
				tally.plain += int(hits)
			}
		default: // time passes, then a look
			what = "time passes"
			var d time.Duration
			switch r.IntN(4) {
			case 0, 1:
				d = time.Duration(r.IntN(50_000)) * time.Microsecond
			case 2:
				d = time.Duration(r.IntN(1_500_000)) * time.Microsecond
			default:
				end := time.UnixMicro((window(now) + 1) * time.Second.Microseconds())
				d = end.Sub(now) - time.Duration(r.IntN(2000))*time.Microsecond
			}
			clock.Set(now.Add(max(d, 0)))
			_, res := call("", 0)
			decided(step, what, res)
		}

		// The equation, in the store's current window.
		w := window(clock.Now())
		b := book(w)
		h := held()
		if count, want := store.count("llm/tenant=acme", rule, w), b.plain+b.beyond+b.unheld+b.spent+h; count != want {
			fail(step, what, "the store counts %d hits in window %d; admitted %d + beyond %d + unheld %d + spent %d + held %d = %d",
				count, w, b.plain, b.beyond, b.unheld, b.spent, h, want)
		}
		if got := b.spent + h + b.released + b.lapsed; got != b.taken {
			fail(step, what, "window %d: spent %d + held %d + released %d + lapsed %d = %d, taken %d", w, b.spent, h, b.released, b.lapsed, got, b.taken)
		}
		for pw, pb := range byWindow {
			if pw < w && pb.spent+pb.released+pb.lapsed != pb.taken {
				fail(step, what, "window %d (past): spent %d + released %d + lapsed %d, taken %d", pw, pb.spent, pb.released, pb.lapsed, pb.taken)
			}
			// The bound: beyond the limit by at most what settles charged
			// beyond their holds (or without one, their hold ended by
			// itself); by nothing of the first with upper-bound estimates.
			if pb.plain+pb.spent > limit || upperBound && pb.beyond > 0 {
				fail(step, what, "window %d charged %d admitted + %d spent + %d beyond + %d unheld: more than the limit %d and what settles charged beyond their holds",
					pw, pb.plain, pb.spent, pb.beyond, pb.unheld, limit)
			}
		}
		var all books
		for _, b := range byWindow {
			all.taken += b.taken
			all.spent += b.spent
			all.released += b.released
			all.lapsed += b.lapsed
		}
		c := ledger.Counts()
		if c.Taken != all.taken || c.Spent != all.spent || c.Released != all.released || c.Lapsed != all.lapsed || c.Held != h ||
			c.Taken != c.Spent+c.Held+c.Releasing+c.Released+c.Lapsed {
			fail(step, what, "the ledger %+v; the books: taken %d, spent %d, held %d, released %d, lapsed %d", c, all.taken, all.spent, h, all.released, all.lapsed)
		}
	}
	return tally
}
