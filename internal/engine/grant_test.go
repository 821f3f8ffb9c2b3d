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

// TestGrantLedger drives the grant policy (package grant: Size, End,
// ReleaseLands and the Ledger's moves) against the reference store on
// seeded random schedules, and checks the invariant of package grant
// exactly after every step: in the store's current window,
//
//	store count = hits the store admitted + spent from grants + held
//	              + releases in flight + lapsed
//
// each grant term counting the hits taken in that window, and the
// ledger's own sums (taken = spent + held + releasing + released + lapsed)
// against the schedule's. Several holders share one counter (a fixed
// window of a second) whose limit a reload raises or lowers at random;
// their takes and releases are in flight for a while (sent at one instant,
// decided at a later one, refused by the store past their deadline, as
// Redis does); time moves in small and large steps and close to the
// window's end; holders spend (some requests are then denied elsewhere and
// put back), release, expire, and die holding hits. The hits admitted in a
// window never exceed the highest limit in force in it, nor the limit when
// none changed.
func TestGrantLedger(t *testing.T) {
	seed := storetest.Seed(t)
	const runs, steps = 300, 2000
	var sum grantTally
	for run := range runs {
		s := seed + uint64(run)
		sum.add(runGrantSchedule(t, s, steps))
		if t.Failed() {
			return
		}
	}
	t.Logf("seeds %d to %d (%d schedules of %d steps): %d grants taken (%d hits), %d spent, %d released, %d lapsed (%d of them releases refused late), %d hits admitted by the store, %d limit changes",
		seed, seed+runs-1, runs, steps, sum.grants, sum.taken, sum.spent, sum.released, sum.lapsed, sum.unlanded, sum.store, sum.changes)
	if sum.spent == 0 || sum.released == 0 || sum.lapsed == 0 || sum.unlanded == 0 || sum.store == 0 || sum.changes == 0 {
		t.Errorf("seed %d: the schedules left a move out (%+v): they test too little of grants", seed, sum)
	}
}

// grantTally sums what the schedules did.
type grantTally struct {
	grants, taken, spent, released, lapsed, unlanded, store, changes uint64
}

func (a *grantTally) add(b grantTally) {
	a.grants += b.grants
	a.taken += b.taken
	a.spent += b.spent
	a.released += b.released
	a.lapsed += b.lapsed
	a.unlanded += b.unlanded
	a.store += b.store
	a.changes += b.changes
}

// Of the schedules: the store's timeout, how long a holder's grant
// should last, and the limits a reload moves between.
const (
	grantTimeout = 20 * time.Millisecond
	grantHold    = 100 * time.Millisecond
)

var grantLimits = []uint32{200, 40, 400, 8}

// grantHolder is one holder of a grant of the schedule's counter: a
// process with a lease slice.
type grantHolder struct {
	g    grant.Grant
	w    int64        // the window its hits were counted in
	rule *engine.Rule // the rule of its last take or request (a lease's follow)
	// What the store said remains of the counter, and in which window.
	remaining  uint64
	remainingW int64
	rate       float64 // hits a second it sees (drawn)
	dead       bool    // killed: its takes in flight land with no one to hold them
}

// inFlight is a take or a release sent and not decided yet.
type inFlight struct {
	h    *grantHolder
	rule *engine.Rule
	hits uint64
	sent time.Time
	w    int64 // a release's window
}

// runGrantSchedule runs one schedule of steps (see TestGrantLedger) and
// returns what it did.
func runGrantSchedule(t *testing.T, seed uint64, steps int) grantTally {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0x9a47))
	clock := storetest.NewClock(storetest.T0.Add(time.Duration(r.IntN(1_000_000)) * time.Microsecond))
	store := &reference{now: clock.Now, states: make(map[[2]string]*engine.State)}
	ruleOf := func(limit uint32) *engine.Rule {
		return engine.MustCompile(engine.Spec{Unit: engine.Second, Multiplier: 1, Limit: limit, Lease: true})
	}
	rule := ruleOf(grantLimits[0])
	var ledger grant.Ledger
	holders := make([]*grantHolder, 2+r.IntN(3))
	for i := range holders {
		holders[i] = &grantHolder{rule: rule}
	}
	var takes, releases []inFlight
	// The schedule's own books, by window: hits the store admitted,
	// taken for grants, spent, released (landed), lapsed; the highest
	// limit in force in the window and whether it changed.
	type books struct {
		store, taken, spent, released, lapsed uint64
		most                                  uint32
		changed                               bool
	}
	byWindow := map[int64]*books{}
	window := func(at time.Time) int64 { return at.UnixMicro() / time.Second.Microseconds() }
	book := func(w int64) *books {
		b := byWindow[w]
		if b == nil {
			b = &books{most: rule.Limit}
			byWindow[w] = b
		}
		return b
	}
	var tally grantTally
	ctx := context.Background()
	fail := func(step int, what string, format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (RLS_TEST_SEED=%d replays it): step %d (%s, T0+%v): %s", seed, seed, step, what,
			clock.Now().Sub(storetest.T0), fmt.Sprintf(format, args...))
	}
	apply := func(hits uint64, rule *engine.Rule, refund bool) (bool, engine.Result) {
		items := [1]engine.Item{{Desc: "d", Rule: rule, Hits: hits, Refund: refund}}
		var res [1]engine.Result
		ok, err := store.Apply(ctx, items[:], res[:])
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		return ok, res[0]
	}
	// lapses moves what a ledger call lapsed into the books of window w.
	lapses := func(w int64, f func()) {
		before := ledger.Counts().Lapsed
		f()
		if d := ledger.Counts().Lapsed - before; d > 0 {
			book(w).lapsed += d
		}
	}
	// release sends the release of h's grant, or lets it lapse when it
	// would not land in its window.
	release := func(h *grantHolder, now time.Time) {
		if hits := ledger.Release(&h.g, now, grantTimeout); hits > 0 {
			releases = append(releases, inFlight{h: h, hits: hits, sent: now, w: h.w})
		}
	}
	// follow makes the current rule h's (a lease's follow): under a lower
	// limit its hits are not spent, but released, or lapse.
	follow := func(h *grantHolder, now time.Time) {
		if h.rule.Limit > rule.Limit && h.g.Left() > 0 {
			release(h, now)
			lapses(h.w, func() { ledger.Lapse(&h.g) })
		}
		h.rule = rule
	}

	for step := range steps {
		now := clock.Now()
		w := window(now)
		h := holders[r.IntN(len(holders))]
		var what string
		switch x := r.IntN(100); {
		case x < 45: // a request on the counter
			what = "request"
			follow(h, now)
			hits := uint64(1 + r.IntN(6))
			if ledger.Spend(&h.g, now, hits) {
				if r.IntN(5) == 0 { // another limit of the request denied it
					what = "request denied elsewhere"
					ledger.Unspend(&h.g, hits)
					break
				}
				if h.w != w {
					fail(step, what, "spent %d hits at window %d from a grant of window %d", hits, w, h.w)
				}
				book(h.w).spent += hits
			} else if ok, _ := apply(hits, rule, false); ok {
				book(w).store += hits
				tally.store += hits
			}
		case x < 57: // a take is sent
			what = "take sent"
			if h.rate == 0 || r.IntN(8) == 0 {
				h.rate = []float64{20, 200, 1000, 4000}[r.IntN(4)]
			}
			remaining := uint64(rule.Limit)
			if h.remainingW == w {
				remaining = min(remaining, h.remaining)
			}
			span := min(grantHold, time.Unix(w+1, 0).Sub(now))
			if size := grant.Size(h.rate, span, remaining); size > 0 {
				takes = append(takes, inFlight{h: h, rule: rule, hits: size, sent: now})
			}
		case x < 67 && len(takes) > 0: // a take is decided
			what = "take decided"
			i := r.IntN(len(takes))
			tk := takes[i]
			takes = append(takes[:i], takes[i+1:]...)
			if now.Sub(tk.sent) > 2*grantTimeout {
				break // past its deadline: the store refuses it
			}
			h := tk.h
			ok, res := apply(tk.hits, tk.rule, false)
			h.remaining, h.remainingW = res.Remaining, w
			if !ok {
				break
			}
			end := grant.End(tk.sent, res.Reset)
			book(w).taken += tk.hits
			if h.dead {
				lapses(w, func() {
					ledger.Take(&h.g, now, tk.hits, end)
					ledger.Lapse(&h.g)
				})
				break
			}
			if tk.rule.Limit > h.rule.Limit {
				// Taken under a limit higher than the holder's now: not
				// spent, released or lapsed at once.
				var g grant.Grant
				ledger.Take(&g, now, tk.hits, end)
				if hits := ledger.Release(&g, now, grantTimeout); hits > 0 {
					releases = append(releases, inFlight{hits: hits, sent: now, w: w})
				}
				lapses(w, func() { ledger.Lapse(&g) })
				break
			}
			lapses(h.w, func() { ledger.Take(&h.g, now, tk.hits, end) })
			h.w = w
		case x < 72: // a holder releases what it holds (quiet, stopping)
			what = "release"
			release(h, now)
		case x < 80 && len(releases) > 0: // a release is decided, or refused late
			what = "release decided"
			i := r.IntN(len(releases))
			rl := releases[i]
			releases = append(releases[:i], releases[i+1:]...)
			if now.Sub(rl.sent) > 2*grantTimeout {
				ledger.Landed(rl.hits, false)
				book(rl.w).lapsed += rl.hits
				break
			}
			apply(rl.hits, rule, true)
			ledger.Landed(rl.hits, true)
			book(rl.w).released += rl.hits
		case x < 81: // a release is not sent after all (the holder closes)
			what = "release kept"
			if hits := ledger.Release(&h.g, now, grantTimeout); hits > 0 {
				ledger.Keep(&h.g, hits)
			}
		case x < 84: // the sweeper ends grants whose time is over
			what = "expire"
			for _, h := range holders {
				lapses(h.w, func() { ledger.Expire(&h.g, now) })
			}
		case x < 86: // a holder dies: what it holds lapses; another starts
			what = "holder dies"
			lapses(h.w, func() { ledger.Lapse(&h.g) })
			h.dead = true
			for i := range holders {
				if holders[i] == h {
					holders[i] = &grantHolder{rule: rule}
				}
			}
		case x < 88: // a reload changes the limit
			what = "limit changed"
			rule = ruleOf(grantLimits[r.IntN(len(grantLimits))])
			b := book(w)
			b.changed = true
			b.most = max(b.most, rule.Limit)
			tally.changes++
		default: // time passes: a little, a lot, or to near the window's end
			what = "time passes"
			var d time.Duration
			switch r.IntN(4) {
			case 0, 1:
				d = time.Duration(r.IntN(5000)) * time.Microsecond
			case 2:
				d = time.Duration(r.IntN(150_000)) * time.Microsecond
			default:
				end := time.Unix(w+1, 0)
				d = max(end.Add(-time.Duration(r.IntN(int(3*grantTimeout/time.Microsecond)))*time.Microsecond).Sub(now), 0)
			}
			clock.Set(now.Add(d))
		}

		// The invariant, in the store's window now.
		now = clock.Now()
		w = window(now)
		b := book(w)
		var held, releasing uint64
		for _, h := range holders {
			if h.w == w {
				held += h.g.Left()
			}
		}
		for _, rl := range releases {
			if rl.w == w {
				releasing += rl.hits
			}
		}
		count := store.count("d", rule, w)
		if want := b.store + b.spent + held + releasing + b.lapsed; count != want {
			fail(step, what, "the store counts %d hits in window %d; admitted by it %d + spent %d + held %d + releasing %d + lapsed %d = %d",
				count, w, b.store, b.spent, held, releasing, b.lapsed, want)
		}
		if got := b.spent + held + releasing + b.lapsed + b.released; got != b.taken {
			fail(step, what, "window %d: spent %d + held %d + releasing %d + lapsed %d + released %d = %d, taken %d",
				w, b.spent, held, releasing, b.lapsed, b.released, got, b.taken)
		}
		if admitted, most := b.store+b.spent, b.most; admitted > uint64(most) || !b.changed && admitted > uint64(rule.Limit) {
			fail(step, what, "window %d admitted %d hits: the limit is %d, the highest in it %d", w, admitted, rule.Limit, most)
		}
		// The ledger's sums, against the books of every window.
		c := ledger.Counts()
		var all books
		var allHeld, allReleasing uint64
		for _, b := range byWindow {
			all.taken += b.taken
			all.spent += b.spent
			all.released += b.released
			all.lapsed += b.lapsed
		}
		for _, h := range holders {
			allHeld += h.g.Left()
		}
		for _, rl := range releases {
			allReleasing += rl.hits
		}
		if c.Taken != all.taken || c.Spent != all.spent || c.Released != all.released || c.Lapsed != all.lapsed ||
			c.Held != allHeld || c.Releasing != allReleasing || c.Taken != c.Spent+c.Held+c.Releasing+c.Released+c.Lapsed {
			fail(step, what, "the ledger %+v; the books: taken %d, spent %d, held %d, releasing %d, released %d, lapsed %d",
				c, all.taken, all.spent, allHeld, allReleasing, all.released, all.lapsed)
		}
	}
	c := ledger.Counts()
	tally.grants, tally.taken, tally.spent, tally.released, tally.lapsed, tally.unlanded = c.Grants, c.Taken, c.Spent, c.Released, c.Lapsed, c.Unlanded
	return tally
}

// count is the hits the counter of (desc, rule) holds in window w (of a
// second), as the reference store keeps it: a fixed window's Count while
// its state is in w.
func (r *reference) count(desc string, rule *engine.Rule, w int64) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.states[[2]string{desc, rule.ID}]
	if st == nil || st.Start != w*time.Second.Microseconds() {
		return 0
	}
	return st.Count
}
