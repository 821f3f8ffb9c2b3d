package lease

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
)

// oneProcess is a lease store over a memory store on a test clock, whose
// takes and releases run when the test says (queued) and whose sweeper
// is the test.
type oneProcess struct {
	clock *storetest.Clock
	inner *memstore.Store
	s     *Store
	tasks []func()
}

func newOneProcess(t *testing.T) *oneProcess {
	p := &oneProcess{clock: storetest.NewClock(storetest.T0)}
	p.inner = memstore.New(memstore.Options{Now: p.clock.Now})
	p.s = newStore(p.inner, Options{Now: p.clock.Now, Hold: 100 * time.Millisecond, Quiet: 250 * time.Millisecond}, false)
	p.s.run = func(f func()) { p.tasks = append(p.tasks, f) }
	t.Cleanup(func() {
		p.runTasks()
		p.s.Close()
		p.inner.Close()
	})
	return p
}

func (p *oneProcess) runTasks() {
	for len(p.tasks) > 0 {
		f := p.tasks[0]
		p.tasks = p.tasks[1:]
		f()
	}
}

func (p *oneProcess) advance(d time.Duration) { p.clock.Set(p.clock.Now().Add(d)) }

// apply sends requests of one hit on rule, one every gap, n of them,
// running the queued tasks after each; it returns how many were admitted.
func (p *oneProcess) apply(t *testing.T, rule *engine.Rule, n int, gap time.Duration) int {
	t.Helper()
	admitted := 0
	items := []engine.Item{{Desc: "d", Rule: rule, Hits: 1}}
	results := make([]engine.Result, 1)
	for range n {
		ok, err := p.s.Apply(context.Background(), items, results)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			admitted++
		}
		p.runTasks()
		p.advance(gap)
	}
	return admitted
}

// counted returns what the memory store counts on rule's counter: the
// capacity less what remains.
func (p *oneProcess) counted(t *testing.T, rule *engine.Rule) uint64 {
	t.Helper()
	items := []engine.Item{{Desc: "d", Rule: rule}}
	results := make([]engine.Result, 1)
	if _, err := p.inner.Peek(context.Background(), items, results); err != nil {
		t.Fatal(err)
	}
	return rule.Capacity() - results[0].Remaining
}

// A token bucket's slice is tokens taken from the bucket: the bucket counts
// them when taken, the process spends them without it, and gives back the
// unused ones when the slice's lifetime ends.
func TestTokenBucketSlice(t *testing.T) {
	p := newOneProcess(t)
	rule := engine.MustCompile(engine.Spec{Algorithm: engine.TokenBucket, Unit: engine.Second, Multiplier: 1, Limit: 1000, Lease: true})
	// 1000 requests a second for 300 ms: slices of about 100 hits.
	if got := p.apply(t, rule, 300, time.Millisecond); got != 300 {
		t.Fatalf("admitted %d of 300 requests within the bucket's rate", got)
	}
	st := p.s.Stats()
	if st.SlicesTaken == 0 || st.HitsLocal < 200 {
		t.Fatalf("stats %+v: most hits should come from slices", st)
	}
	held, _ := p.s.Held("d", rule, p.clock.Now())
	t.Logf("stats %+v; held %d", st, held)
	// Quiet past the slice's lifetime: the unused tokens go back.
	p.advance(300 * time.Millisecond)
	p.s.sweep(p.clock.Now())
	p.runTasks()
	if held, _ := p.s.Held("d", rule, p.clock.Now()); held != 0 {
		t.Errorf("still holds %d tokens after the slice's lifetime", held)
	}
	if st := p.s.Stats(); st.HitsReleased == 0 || st.HitsHeld != 0 {
		t.Errorf("stats %+v: the unused tokens should be released", st)
	}
	// The bucket refilled over the quiet 300 ms: full again.
	if got := p.counted(t, rule); got != 0 {
		t.Errorf("the bucket counts %d tokens after refilling, want 0", got)
	}
}

// A window's slice is released when the counter goes quiet, and the
// store then counts exactly the hits admitted.
func TestQuietCounterGivesBack(t *testing.T) {
	p := newOneProcess(t)
	rule := engine.MustCompile(engine.Spec{Unit: engine.Minute, Multiplier: 1, Limit: 100000, Lease: true})
	if got := p.apply(t, rule, 500, 200*time.Microsecond); got != 500 {
		t.Fatalf("admitted %d of 500", got)
	}
	if p.counted(t, rule) <= 500 {
		t.Fatalf("the store counts %d: no slice held beyond the hits admitted", p.counted(t, rule))
	}
	p.advance(300 * time.Millisecond)
	p.s.sweep(p.clock.Now())
	p.runTasks()
	if got := p.counted(t, rule); got != 500 {
		t.Errorf("after a quiet spell the store counts %d, want the 500 admitted", got)
	}
}

// Requests on a leased and an unleased limit are all-or-nothing: when the
// store denies the unleased one, the slice gets its hit back.
func TestAllOrNothingAcrossSliceAndStore(t *testing.T) {
	p := newOneProcess(t)
	leased := engine.MustCompile(engine.Spec{Unit: engine.Minute, Multiplier: 1, Limit: 100000, Lease: true})
	p.apply(t, leased, 100, time.Millisecond) // a slice is held now
	held, _ := p.s.Held("d", leased, p.clock.Now())
	if held == 0 {
		t.Fatal("no slice held")
	}
	closed := engine.MustCompile(engine.Spec{Unit: engine.Minute, Multiplier: 1, Limit: 0})
	items := []engine.Item{{Desc: "d", Rule: leased, Hits: 1}, {Desc: "d", Rule: closed, Hits: 1}}
	results := make([]engine.Result, 2)
	ok, err := p.s.Apply(context.Background(), items, results)
	if err != nil || ok {
		t.Fatalf("Apply = %v, %v; want denied by the limit of 0", ok, err)
	}
	if !results[0].Admitted || results[1].Admitted {
		t.Errorf("verdicts %+v: the slice admits its item, the store denies the other", results)
	}
	if after, _ := p.s.Held("d", leased, p.clock.Now()); after != held {
		t.Errorf("the slice holds %d after a denied request, want %d as before", after, held)
	}
	// Peek counts the slice in the remaining, and admits from it.
	if ok, err := p.s.Peek(context.Background(), items[:1], results[:1]); err != nil || !ok || results[0].Remaining < held {
		t.Errorf("Peek = %v, %v, %+v: want admitted, remaining counting the %d held", ok, err, results[0], held)
	}
}

// A slice is never spent past its window: at the window's end what is left
// lapses, and the next window's requests go to the store until a new slice
// is taken there.
func TestSliceEndsWithItsWindow(t *testing.T) {
	p := newOneProcess(t)
	rule := engine.MustCompile(engine.Spec{Unit: engine.Second, Multiplier: 1, Limit: 100000, Lease: true})
	p.advance(800 * time.Millisecond)
	p.apply(t, rule, 250, time.Millisecond) // 200 in this window, 50 in the next
	if p.s.Stats().SlicesTaken < 2 {
		t.Fatalf("stats %+v: want slices in both windows", p.s.Stats())
	}
	// The new window counts its own slices and hits only: 50 admitted in
	// it, plus what the process holds.
	held, _ := p.s.Held("d", rule, p.clock.Now())
	if got := p.counted(t, rule); got != 50+held {
		t.Errorf("the new window counts %d, want 50 admitted + %d held", got, held)
	}
}

// A reset drops the process's slice of the counter as well as the
// store's count: the limit starts afresh, with nothing held here.
func TestResetDropsTheSlice(t *testing.T) {
	p := newOneProcess(t)
	rule := engine.MustCompile(engine.Spec{Unit: engine.Minute, Multiplier: 1, Limit: 1000, Lease: true})
	if got := p.apply(t, rule, 500, 50*time.Microsecond); got != 500 {
		t.Fatalf("admitted %d of 500", got)
	}
	held, _ := p.s.Held("d", rule, p.clock.Now())
	if held == 0 {
		t.Fatalf("no slice held after 500 requests")
	}
	before := p.s.Stats()
	n, err := p.s.Reset(context.Background(), []engine.Item{{Desc: "d", Rule: rule}})
	if err != nil || n != 1 {
		t.Fatalf("Reset = %d, %v; want 1 counter cleared", n, err)
	}
	if held, _ := p.s.Held("d", rule, p.clock.Now()); held != 0 || p.s.Stats().HitsHeld != 0 {
		t.Errorf("holds %d hits (stats %+v) after the reset", held, p.s.Stats())
	}
	// The hits dropped lapse: the ledger still accounts for every hit taken.
	st := p.s.Stats()
	if st.HitsLapsed-before.HitsLapsed != held || st.HitsTaken != st.HitsLocal+st.HitsHeld+st.HitsReleasing+st.HitsReleased+st.HitsLapsed {
		t.Errorf("stats %+v after a reset that dropped %d held hits: want them lapsed, and taken = spent + held + releasing + released + lapsed", st, held)
	}
	// The window admits its whole limit again, and no more: the old
	// slice's hits are not spent on top.
	if got := p.apply(t, rule, 1100, 50*time.Microsecond); got != 1000 {
		t.Errorf("after the reset the window admitted %d of 1100 requests, want its limit 1000", got)
	}
}

// A changed limit applies to the next slice (issue #33): a raise keeps the
// slice held (its hits were counted within the smaller limit); a lowered
// limit or burst gives it back and decides in the store; a take in flight
// under the old limit is released when it lands.
func TestChangedLimitAppliesToNextSlice(t *testing.T) {
	for _, tc := range []struct {
		name          string
		start, raised *engine.Rule
		lowered       *engine.Rule
	}{
		{"fixed window", leasedRule(engine.FixedWindow, 1000, 0), leasedRule(engine.FixedWindow, 2000, 0), leasedRule(engine.FixedWindow, 100, 0)},
		{"token bucket, burst lowered", leasedRule(engine.TokenBucket, 1000, 500), leasedRule(engine.TokenBucket, 1000, 800), leasedRule(engine.TokenBucket, 1000, 100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newOneProcess(t)
			held := func(rule *engine.Rule) uint64 {
				n, _ := p.s.Held("d", rule, p.clock.Now())
				return n
			}
			if n := p.apply(t, tc.start, 50, time.Millisecond); n != 50 {
				t.Fatalf("step 1: 50 requests under %d: %d admitted", tc.start.Limit, n)
			}
			h := held(tc.start)
			if h == 0 {
				t.Fatal("step 1: no slice held after 50 requests")
			}
			if got := held(tc.raised); got != h {
				t.Errorf("step 2: Held under the raised limit = %d, want the %d held", got, h)
			}
			local := p.s.Stats().HitsLocal
			p.apply(t, tc.raised, 1, time.Millisecond)
			if p.s.Stats().HitsLocal != local+1 {
				t.Errorf("step 2: a request under the raised limit was not admitted from the slice")
			}
			// Lowered: nothing held is spent under it.
			if got := held(tc.lowered); got != 0 {
				t.Errorf("step 3: Held under the lowered limit = %d, want 0", got)
			}
			gave := p.s.Stats().HitsReleased
			h = p.s.Stats().HitsHeld
			local = p.s.Stats().HitsLocal
			items := []engine.Item{{Desc: "d", Rule: tc.lowered, Hits: 1}}
			results := make([]engine.Result, 1)
			if _, err := p.s.Apply(context.Background(), items, results); err != nil {
				t.Fatal(err)
			}
			if st := p.s.Stats(); st.HitsLocal != local || st.HitsHeld != 0 {
				t.Errorf("step 3: the first request under the lowered limit: %d admitted from slices, %d held; want none of the old slice", st.HitsLocal-local, st.HitsHeld)
			}
			p.runTasks()
			if got := p.s.Stats().HitsReleased - gave; got < h {
				t.Errorf("step 3: %d hits released, want the %d held", got, h)
			}
			// A take sent under the old limit lands after the change.
			p.advance(time.Second) // a fresh window, a full bucket
			p.tasks = nil
			p.apply(t, tc.start, 1, 0) // its take runs: a slice
			if held(tc.start) == 0 {
				t.Fatal("step 4: no slice after a request under the old limit")
			}
			p.s.sweep(p.clock.Now().Add(time.Hour)) // quiet: released
			p.runTasks()
			if _, err := p.s.Apply(context.Background(), []engine.Item{{Desc: "d", Rule: tc.start, Hits: 1}}, results); err != nil {
				t.Fatal(err)
			}
			if len(p.tasks) != 1 {
				t.Fatalf("step 4: %d tasks queued after a request with no slice, want its take", len(p.tasks))
			}
			gave = p.s.Stats().HitsReleased
			if _, err := p.s.Apply(context.Background(), []engine.Item{{Desc: "d", Rule: tc.lowered, Hits: 1}}, results); err != nil {
				t.Fatal(err)
			}
			p.runTasks() // the take under the old limit lands, then its release
			if got := held(tc.lowered); got != 0 {
				t.Errorf("step 4: a take under the old limit landed after the change: %d held, want 0", got)
			}
			if p.s.Stats().HitsReleased == gave {
				t.Errorf("step 4: the take under the old limit was not released")
			}
		})
	}
}

func leasedRule(alg string, limit, burst uint32) *engine.Rule {
	return engine.MustCompile(engine.Spec{Algorithm: alg, Unit: engine.Second, Multiplier: 1, Limit: limit, Burst: engine.Opt[uint32]{V: burst, Set: burst > 0}, Lease: true})
}
