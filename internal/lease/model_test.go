package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
)

// sim runs several lease stores ("processes") over one shared inner store
// on a test clock. Their takes and releases wait in a queue, run when
// the test says, in any order; the sweeper runs when the test says. A task
// run later than storeTimeout after it was queued is refused by the inner
// store, as Redis refuses a request past its deadline.
type sim struct {
	t     *testing.T
	clock *storetest.Clock
	inner engine.Store
	procs []*simProc
	all   []*Store // every process started
	// queuedAt is when the task being run was queued (see deadlined).
	queuedAt time.Time
}

type simProc struct {
	s     *Store
	tasks []simTask
}

type simTask struct {
	at time.Time
	f  func()
}

const simStoreTimeout = 20 * time.Millisecond

// deadlined is the inner store as the processes see it: a call made by a
// task queued longer ago than simStoreTimeout decides nothing.
type deadlined struct{ sim *sim }

var errSimExpired = errors.New("sim: past its deadline")

func (d deadlined) expired() bool {
	return !d.sim.queuedAt.IsZero() && d.sim.clock.Now().Sub(d.sim.queuedAt) > simStoreTimeout
}

func (d deadlined) Apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if d.expired() {
		return false, errSimExpired
	}
	return d.sim.inner.Apply(ctx, items, results)
}

func (d deadlined) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	return d.sim.inner.Peek(ctx, items, results)
}

func (d deadlined) Reset(ctx context.Context, items []engine.Item) (int, error) {
	return d.sim.inner.Reset(ctx, items)
}

func (d deadlined) Ping(ctx context.Context) error { return d.sim.inner.Ping(ctx) }

func newSim(t *testing.T, inner engine.Store, clock *storetest.Clock, procs int) *sim {
	m := &sim{t: t, clock: clock, inner: inner}
	for range procs {
		m.procs = append(m.procs, m.start())
	}
	return m
}

// start makes a process: a Store with no sweeper of its own, whose tasks
// queue.
func (m *sim) start() *simProc {
	p := &simProc{}
	p.s = newStore(deadlined{m}, Options{Now: m.clock.Now, StoreTimeout: simStoreTimeout, Hold: 100 * time.Millisecond, Quiet: 30 * time.Millisecond}, false)
	p.s.run = func(f func()) { p.tasks = append(p.tasks, simTask{at: m.clock.Now(), f: f}) }
	m.all = append(m.all, p.s)
	return p
}

// runTasks runs n of p's queued tasks (all when n < 0), picked by r.
func (m *sim) runTasks(p *simProc, r *rand.Rand, n int) {
	for n != 0 && len(p.tasks) > 0 {
		i := r.IntN(len(p.tasks))
		task := p.tasks[i]
		p.tasks = append(p.tasks[:i], p.tasks[i+1:]...)
		m.queuedAt = task.at
		task.f()
		m.queuedAt = time.Time{}
		n--
	}
}

// TestNeverOverAdmits replays random sequences of requests of random hits
// from several processes sharing a store, with their takes and releases
// run in random order and late, processes killed (their slices lapse) or
// stopped (released), sweeps, window ends and changes of the leased
// limit (a reload), and checks them against an exact model: in every
// window, the hits admitted on each limit are at most its limit, and the
// store counted every one of them. After a change of the leased limit, the
// hits admitted in the window are at most the new limit, or what was
// admitted in it before the change and what the processes then held in
// slices taken under a limit no higher than the new one (a lowered limit
// denies the rest of the window), and the windows after it admit at most
// the new limit. A leased
// limit shares its descriptor with an unleased one, so requests on both
// are all-or-nothing across the slice and the store; some count denied
// hits.
func TestNeverOverAdmits(t *testing.T) {
	all := runModel(t, 100, func(t *testing.T, _ int, clock *storetest.Clock) engine.Store {
		inner := memstore.New(memstore.Options{Now: clock.Now})
		t.Cleanup(func() { inner.Close() })
		return inner
	})
	if all.HitsLapsed == 0 {
		t.Error("the sequences lapsed nothing: they test too little of leases")
	}
}

// runModel runs checkModel for 3000 steps on runs seeds from the test's
// (storetest.Seed), each on the inner store that newInner makes for its
// run on its clock, and returns their stats summed; it fails when they
// decided nothing from slices or gave nothing back.
func runModel(t *testing.T, runs int, newInner func(t *testing.T, run int, clock *storetest.Clock) engine.Store) Stats {
	t.Helper()
	s := storetest.Seed(t)
	var all Stats
	for run := range runs {
		runSeed := s + uint64(run)
		t.Run(fmt.Sprint(runSeed), func(t *testing.T) {
			clock := storetest.NewClock(storetest.T0)
			st := checkModel(t, runSeed, newInner(t, run, clock), clock, 3000)
			all.SlicesTaken += st.SlicesTaken
			all.HitsLocal += st.HitsLocal
			all.HitsReleased += st.HitsReleased
			all.HitsLapsed += st.HitsLapsed
		})
	}
	t.Logf("seeds %d to %d: %d slices taken, %d hits admitted from slices, %d released, %d lapsed", s, s+uint64(runs)-1, all.SlicesTaken, all.HitsLocal, all.HitsReleased, all.HitsLapsed)
	if all.HitsLocal == 0 || all.HitsReleased == 0 {
		t.Errorf("seed %d: the sequences decided nothing from slices or gave nothing back: they test too little of leases", s)
	}
	return all
}

// leasedLimits are the limits the leased rule of checkModel takes, one of
// them at a time: each change is a reload that raises or lowers it.
var leasedLimits = []uint32{200, 40, 400, 8}

// checkModel runs one random sequence of steps on inner (see
// TestNeverOverAdmits) and returns the processes' stats, summed.
func checkModel(t *testing.T, seed uint64, inner engine.Store, clock *storetest.Clock, steps int) Stats {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0x1ea5e))
	leasedRule := func(limit uint32) *engine.Rule {
		return engine.MustCompile(engine.Spec{Unit: engine.Second, Multiplier: 1, Limit: limit, Lease: true})
	}
	leased := leasedRule(leasedLimits[0])
	other := engine.MustCompile(engine.Spec{Unit: engine.Minute, Multiplier: 1, Limit: 3000})
	m := newSim(t, inner, clock, 2+r.IntN(3))
	window := func(rule *engine.Rule, at time.Time) int64 { return at.UnixMicro() / rule.Window.Microseconds() }
	// admitted counts the hits admitted by (rule ID, window); ceiling says
	// how many a window of the leased limit may admit, where a change made
	// it other than the limit.
	admitted := map[string]uint64{}
	ceiling := map[int64]uint64{}
	key := func(rule *engine.Rule, w int64) string { return fmt.Sprint(rule.ID, "/", w) }
	mostOf := func(rule *engine.Rule, w int64) uint64 {
		if rule.ID == leased.ID {
			if c, ok := ceiling[w]; ok {
				return c
			}
		}
		return uint64(rule.Limit)
	}
	var items [2]engine.Item
	var results [2]engine.Result
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (RLS_TEST_SEED=%d replays it): %s", seed, seed, fmt.Sprintf(format, args...))
	}
	for step := range steps {
		pi := r.IntN(len(m.procs))
		p := m.procs[pi]
		switch x := r.IntN(100); {
		case x < 60: // a request
			hits := uint64(1 + r.IntN(4))
			its := items[:1]
			its[0] = engine.Item{Desc: "d", Rule: leased, Hits: hits, CountDenied: r.IntN(10) == 0}
			if r.IntN(4) == 0 {
				its = items[:2]
				its[1] = engine.Item{Desc: "d", Rule: other, Hits: 1}
			}
			ok, err := p.s.Apply(context.Background(), its, results[:len(its)])
			if err != nil {
				fail("step %d: %v", step, err)
			}
			if ok {
				now := clock.Now()
				for _, it := range its {
					w := window(it.Rule, now)
					k := key(it.Rule, w)
					admitted[k] += it.Hits
					if most := mostOf(it.Rule, w); admitted[k] > most {
						fail("step %d: %d hits admitted in window %d of the limit of %d (at most %d since the last change)", step, admitted[k], w, it.Rule.Limit, most)
					}
				}
			}
		case x < 80: // some of its takes and releases happen
			m.runTasks(p, r, 1+r.IntN(3))
		case x < 90: // time passes: often a little, for steps close to a window's end
			span := 100_000
			if r.IntN(2) == 0 {
				span = 5_000
			}
			clock.Set(clock.Now().Add(time.Duration(r.IntN(span)) * time.Microsecond))
		case x < 98:
			p.s.sweep(clock.Now())
		case x < 99: // a reload changes the leased limit, for every process at once
			leased = leasedRule(leasedLimits[r.IntN(len(leasedLimits))])
			now := clock.Now()
			w := window(leased, now)
			// Hits held in slices that the new limit lets the processes spend:
			// counted in the store, as if admitted when taken.
			var held uint64
			for _, p := range m.procs {
				if c := p.s.lookup("d", leased); c != nil {
					c.mu.Lock()
					if c.rule.Limit <= leased.Limit {
						h, _ := c.grant.Held(now)
						held += h
					}
					c.mu.Unlock()
				}
			}
			ceiling[w] = max(admitted[key(leased, w)]+held, uint64(leased.Limit))
			for k := range ceiling {
				if k < w {
					delete(ceiling, k)
				}
			}
		case r.IntN(2) == 0: // killed: what it holds and has queued lapses
			m.procs[pi] = m.start()
		default: // stopped: it gives back what it holds
			m.runTasks(p, r, -1)
			p.s.Close()
			m.procs[pi] = m.start()
		}
		// The store counted at least what was admitted in this window.
		now := clock.Now()
		look := [1]engine.Item{{Desc: "d", Rule: leased}}
		var res [1]engine.Result
		if _, err := inner.Peek(context.Background(), look[:], res[:]); err != nil {
			fail("step %d: peek: %v", step, err)
		}
		counted := uint64(leased.Limit) - res[0].Remaining
		if got := admitted[key(leased, window(leased, now))]; counted < got && res[0].Remaining > 0 {
			fail("step %d: the store counts %d hits in this window, %d were admitted", step, counted, got)
		}
		// Each process's ledger (grant.Ledger) accounts for every hit
		// it took.
		for i, p := range m.procs {
			st := p.s.Stats()
			if sum := st.HitsLocal + st.HitsHeld + st.HitsReleasing + st.HitsReleased + st.HitsLapsed; sum != st.HitsTaken {
				fail("step %d: process %d took %d hits; spent %d + held %d + releasing %d + released %d + lapsed %d = %d",
					step, i, st.HitsTaken, st.HitsLocal, st.HitsHeld, st.HitsReleasing, st.HitsReleased, st.HitsLapsed, sum)
			}
		}
	}
	var st Stats
	for _, s := range m.all {
		x := s.Stats()
		st.SlicesTaken += x.SlicesTaken
		st.HitsLocal += x.HitsLocal
		st.HitsReleased += x.HitsReleased
		st.HitsLapsed += x.HitsLapsed
	}
	return st
}
