package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/redistest"
)

// process is one rls process on a shared Redis: its own Redis store
// (connections, pipelines) and lease store.
type process struct {
	redis *redisstore.Store
	lease *Store
}

func startProcess(t *testing.T, opts redisstore.Options, sweeper bool) *process {
	t.Helper()
	rs, err := redisstore.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	p := &process{redis: rs, lease: newStore(rs, Options{StoreTimeout: rs.DecisionTimeout()}, sweeper)}
	t.Cleanup(func() {
		p.lease.Close()
		rs.Close()
	})
	return p
}

// tally counts the hits admitted per window, by the window's end as each
// answer gives it (now + Reset, to the nearest window end).
type tally struct {
	mu     sync.Mutex
	window time.Duration
	hits   map[int64]uint64        // by window end, µs
	off    map[int64]time.Duration // the farthest an answer's end was from it
}

func newTally(window time.Duration) *tally {
	return &tally{window: window, hits: map[int64]uint64{}, off: map[int64]time.Duration{}}
}

func (ta *tally) add(now time.Time, r *engine.Result, hits uint64) {
	end := now.Add(r.Reset).Round(ta.window)
	k := end.UnixMicro()
	ta.mu.Lock()
	ta.hits[k] += hits
	ta.off[k] = max(ta.off[k], end.Sub(now.Add(r.Reset)).Abs())
	ta.mu.Unlock()
}

// drive has each process send, from workers goroutines each, a request of
// one hit on the hot counter every gap until stop closes, and counts the
// admitted ones in ta. A request that fails (the store timed out: a
// starved machine) is not admitted, which the exactness checks allow; the
// failures are counted and logged, and the windows must still reach their
// share of the limit.
func drive(t *testing.T, ps []*process, workers int, gap time.Duration, rule *engine.Rule, ta *tally, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	var failed atomic.Int64
	t.Cleanup(func() {
		if n := failed.Load(); n > 0 {
			t.Logf("%d requests failed (store timeouts), none admitted", n)
		}
	})
	for _, p := range ps {
		for range workers {
			wg.Go(func() {
				items := []engine.Item{{Desc: "hot/tenant=t1", Rule: rule, Hits: 1}}
				results := make([]engine.Result, 1)
				tick := time.NewTicker(gap)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					now := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
					ok, err := p.lease.Apply(ctx, items, results)
					cancel()
					if err != nil {
						if failed.Add(1) == 1 {
							t.Logf("apply (the first failure): %v", err)
						}
						continue
					}
					if ok {
						ta.add(now, &results[0], 1)
					}
				}
			})
		}
	}
	return &wg
}

// checkWindows checks the windows that the run covered whole: at most the
// limit admitted in each, and at least min of it.
func checkWindows(t *testing.T, ta *tally, from, to time.Time, limit uint64, min float64) {
	t.Helper()
	whole := 0
	for end, hits := range ta.hits {
		e := time.UnixMicro(end)
		if hits > limit {
			t.Errorf("window ending %s: %d hits admitted, more than the limit %d (answers' ends off by %s at most)", e.Format("15:04:05.000"), hits, limit, ta.off[end])
		}
		if e.Add(-ta.window).Before(from) || e.After(to) {
			t.Logf("window ending %s: %d of %d admitted (not whole in the run)", e.Format("15:04:05.000"), hits, limit)
			continue
		}
		whole++
		t.Logf("window ending %s: %d of %d admitted (%.1f%%)", e.Format("15:04:05.000"), hits, limit, 100*float64(hits)/float64(limit))
		if float64(hits) < min*float64(limit) {
			t.Errorf("window ending %s: %d hits admitted, less than %.0f%% of the limit %d", e.Format("15:04:05.000"), hits, 100*min, limit)
		}
	}
	if whole < 2 {
		t.Errorf("only %d whole windows in the run", whole)
	}
}

// hotRun runs two processes against opts' Redis for a few windows of a
// leased limit of 2000 a second, each with workers that send a request
// every gap (4 workers every 800µs: demand about five times the limit),
// and checks every window: at most the limit, at least min of it.
func hotRun(t *testing.T, opts redisstore.Options, workers int, gap time.Duration, min float64) {
	const limit = 2000
	rule := engine.MustCompile(engine.Spec{Unit: engine.Second, Multiplier: 1, Limit: limit, Lease: true})
	ps := []*process{startProcess(t, opts, true), startProcess(t, opts, true)}
	ta := newTally(time.Second)
	stop := make(chan struct{})
	from := time.Now()
	wg := drive(t, ps, workers, gap, rule, ta, stop)
	time.Sleep(3500 * time.Millisecond)
	close(stop)
	wg.Wait()
	checkWindows(t, ta, from, time.Now(), limit, min)
	for i, p := range ps {
		ls, rs := p.lease.Stats(), p.redis.Stats()
		t.Logf("process %d: %d slices (%d hits) taken, %d hits admitted from them, %d released, %d lapsed; %d Redis scripts",
			i, ls.SlicesTaken, ls.HitsTaken, ls.HitsLocal, ls.HitsReleased, ls.HitsLapsed, rs.Scripts)
		if ls.HitsLocal == 0 {
			t.Errorf("process %d admitted no hit from a slice", i)
		}
	}
}

// TestHotKeyTwoProcesses: two processes on one Redis, a hot leased limit
// asked five times over: each window admits at most the limit, exactly,
// and at least 90% of it.
func TestHotKeyTwoProcesses(t *testing.T) {
	srv := redistest.Start(t)
	hotRun(t, redisstore.Options{URL: srv.URL(), Timeout: 20 * time.Millisecond}, 4, 800*time.Microsecond, 0.9)
}

// TestHotKeyModestDemand: two processes asking about 1.25 times the
// limit between them (each 2 workers, a request every 1.6ms: 1250/s a
// process, ticks permitting). Whoever holds a slice when the other is
// refused costs admissions: the windows still admit most of the limit.
func TestHotKeyModestDemand(t *testing.T) {
	srv := redistest.Start(t)
	hotRun(t, redisstore.Options{URL: srv.URL(), Timeout: 20 * time.Millisecond}, 2, 1600*time.Microsecond, 0.9)
}

// TestHotKeyTwoProcessesCluster is TestHotKeyTwoProcesses on a Redis
// Cluster of three masters.
func TestHotKeyTwoProcessesCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	hotRun(t, redisstore.Options{ClusterSeeds: c.Seeds(), Timeout: 20 * time.Millisecond}, 4, 800*time.Microsecond, 0.9)
}

// TestKilledProcessLosesOnlyItsSlice: of two processes on a hot leased
// limit, one dies early in a window holding a slice (nothing released). The
// window it dies in still admits at most the limit; the next windows,
// the other process alone admits at least 90% of it: what the dead one
// held lapsed: counted until its window ended, no longer.
func TestKilledProcessLosesOnlyItsSlice(t *testing.T) {
	const limit = 2000
	srv := redistest.Start(t)
	opts := redisstore.Options{URL: srv.URL(), Timeout: 20 * time.Millisecond}
	rule := engine.MustCompile(engine.Spec{Unit: engine.Second, Multiplier: 1, Limit: limit, Lease: true})
	// The victim has no sweeper: it never gives back, as a killed process.
	victim, survivor := startProcess(t, opts, false), startProcess(t, opts, true)
	ta := newTally(time.Second)
	stopVictim, stopSurvivor := make(chan struct{}), make(chan struct{})
	// Start just after a window starts, kill half a window in.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
	wv := drive(t, []*process{victim}, 4, 800*time.Microsecond, rule, ta, stopVictim)
	ws := drive(t, []*process{survivor}, 4, 800*time.Microsecond, rule, ta, stopSurvivor)
	// 80 ms in, the limit is not spent yet (demand 5 × it): the victim
	// holds a slice.
	time.Sleep(80 * time.Millisecond)
	victim.lease.closed.Store(true) // takes nothing more: killed
	close(stopVictim)
	wv.Wait()
	held, _ := victim.lease.Held("hot/tenant=t1", rule, time.Now())
	t.Logf("the victim dies holding %d hits", held)
	after := time.Now()
	time.Sleep(3000 * time.Millisecond)
	close(stopSurvivor)
	ws.Wait()
	checkWindows(t, ta, after, time.Now(), limit, 0.9)
}

// TestRedisSilentSpendsOnlyTheSlice: while Redis does not answer, a
// process goes on admitting from the slice it holds, never more: exactly
// the hits it held, then every request fails as without lease.
func TestRedisSilentSpendsOnlyTheSlice(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	p := startProcess(t, redisstore.Options{URL: "redis://" + proxy.Addr() + "/0", Timeout: 20 * time.Millisecond}, true)
	rule := engine.MustCompile(engine.Spec{Unit: engine.Hour, Multiplier: 1, Limit: 1_000_000, Lease: true})
	items := []engine.Item{{Desc: "hot/tenant=t1", Rule: rule, Hits: 1}}
	results := make([]engine.Result, 1)
	apply := func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		return p.lease.Apply(ctx, items, results)
	}
	for range 300 {
		if ok, err := apply(); !ok || err != nil {
			t.Fatalf("before the fault: %v, %v", ok, err)
		}
		time.Sleep(200 * time.Microsecond)
	}
	// Wait for the take in flight, if any, then cut Redis off.
	time.Sleep(50 * time.Millisecond)
	proxy.SetBlackHole(true)
	held, _ := p.lease.Held("hot/tenant=t1", rule, time.Now())
	if held == 0 {
		t.Fatal("no slice held when Redis went silent")
	}
	admitted := uint64(0)
	for range held + 10 {
		ok, err := apply()
		if err != nil {
			break
		}
		if !ok {
			t.Fatalf("denied while Redis is silent, after %d admitted", admitted)
		}
		admitted++
	}
	if admitted != held {
		t.Errorf("Redis silent: %d admitted, want exactly the %d held", admitted, held)
	}
	proxy.SetBlackHole(false)
	proxy.Heal()
	t.Logf("held %d when Redis went silent; admitted %d meanwhile", held, admitted)
}

// redisOnClock returns a Redis store on srv whose scripts decide at
// clock's readings, its keys under prefix (a run's own). Its timeout is
// long: on a loaded machine a request must not fail, the model's time is
// the clock's.
func redisOnClock(t *testing.T, srv *redistest.Server, clock *storetest.Clock, prefix string) *redisstore.Store {
	t.Helper()
	rs, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: prefix, Now: clock.Now, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestNeverOverAdmitsRedis is TestNeverOverAdmits on Redis, on a test
// clock: random sequences of requests, takes and releases run late and
// in any order, processes killed and stopped, window ends and changes of
// the leased limit, checked against the same exact model.
func TestNeverOverAdmitsRedis(t *testing.T) {
	srv := redistest.Start(t)
	runModel(t, 12, func(t *testing.T, run int, clock *storetest.Clock) engine.Store {
		return redisOnClock(t, srv, clock, fmt.Sprintf("run%d:", run))
	})
}

// TestReloadReachesLeasedLimit is issue #33's reproduction: a leased 1000
// per 10 s, asked 100 times a second, lowered to 20 mid-window by a
// reload. The process kept taking slices under the rule its counter's
// record was made with, so the next window admitted 867. Now the rest of
// the window of the change admits nothing (the counter is past 20) and
// each later window admits the new limit, exactly.
func TestReloadReachesLeasedLimit(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0) // a 10 s window starts at T0
	m := newSim(t, redisOnClock(t, srv, clock, "reload:"), clock, 1)
	p := m.procs[0]
	r := rand.New(rand.NewPCG(1, 2))
	leased := func(limit uint32) *engine.Rule {
		return engine.MustCompile(engine.Spec{Unit: engine.Second, Multiplier: 10, Limit: limit, Lease: true})
	}
	rule := leased(1000)
	const (
		gap    = 10 * time.Millisecond // 100 requests a second
		change = 1500                  // the request at 15 s: mid second window
		total  = 4000                  // 40 s: two whole windows after it
	)
	perWindow := map[int]uint64{}
	var afterChange uint64
	items := []engine.Item{{Desc: "api", Hits: 1}}
	results := make([]engine.Result, 1)
	for i := range total {
		if i == change {
			rule = leased(20)
		}
		items[0].Rule = rule
		ok, err := p.s.Apply(context.Background(), items, results)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if ok {
			perWindow[i/1000]++
			if i >= change && i/1000 == change/1000 {
				afterChange++
			}
		}
		m.runTasks(p, r, -1) // takes and releases land before the next request
		if i%5 == 0 {
			p.s.sweep(clock.Now())
		}
		clock.Set(clock.Now().Add(gap))
	}
	t.Logf("admitted per 10 s window: %v; after the change in its window: %d", perWindow, afterChange)
	if afterChange > 0 {
		t.Errorf("the window of the change admitted %d after it; its counter is past the new limit 20, want 0", afterChange)
	}
	for w := change/1000 + 1; w < total/1000; w++ {
		if perWindow[w] != 20 {
			t.Errorf("window %d, after the limit was lowered to 20: %d admitted, want 20", w, perWindow[w])
		}
	}
	if perWindow[0] > 1000 || perWindow[0] < 900 {
		t.Errorf("window 0, limit 1000 asked 1000 times: %d admitted, want at most 1000 and most of it", perWindow[0])
	}
}
