package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/service"
)

// overrideValues are the requests_per_unit that the runtime overrides of
// TestOverrideBound set, one at a time: raised, lowered, 0.
var overrideValues = []uint32{200, 40, 400, 8, 0, 120}

// TestOverrideBound replays random sequences of requests from processes
// that share a Redis store (its denial cache on) and its overrides, each
// deciding through its own service and lease store, while one process
// sets overrides of the limit (a raise, a lowering, 0) that the others
// apply some steps later (a notice or a poll in flight). It checks the
// README's bound: in the window of a change, the hits admitted are at
// most the new limit, or what the window admitted before the change and
// what the processes then held in slices taken under a limit no higher
// than the new one, plus what the processes that had not applied the
// change yet admitted after it; each later window at most the new limit
// (plus the same lag). Run on a leased limit and on an unleased one
// (where the denial cache answers).
func TestOverrideBound(t *testing.T) {
	srv := redistest.Start(t)
	seed := storetest.Seed(t)
	for _, lease := range []bool{true, false} {
		t.Run(fmt.Sprintf("lease=%v", lease), func(t *testing.T) {
			var cacheHits, local uint64
			for run := range 6 {
				runSeed := seed + uint64(run)
				t.Run(fmt.Sprint(runSeed), func(t *testing.T) {
					h, l := checkOverrideBound(t, srv, runSeed, lease, fmt.Sprintf("bound%v%d:", lease, run))
					cacheHits += h
					local += l
				})
			}
			t.Logf("lease=%v: %d requests answered from the denial cache, %d hits admitted from slices", lease, cacheHits, local)
			if lease && local == 0 {
				t.Error("no hit admitted from a slice: the sequences test too little of leases")
			}
		})
	}
}

// checkOverrideBound runs one sequence (see TestOverrideBound) and
// returns the denial cache's hits and the hits admitted from slices.
func checkOverrideBound(t *testing.T, srv *redistest.Server, seed uint64, leased bool, prefix string) (cacheHits, local uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0x0e7))
	clock := storetest.NewClock(storetest.T0)
	rs, err := redisstore.New(redisstore.Options{URL: srv.URL(), Prefix: prefix, Now: clock.Now, Timeout: time.Second, DenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("limits.yaml", []byte(fmt.Sprintf(`
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: %d, lease: %v}
`, overrideValues[0], leased)))
	if err != nil {
		t.Fatal(err)
	}
	limit := cfg.Limits()[0]
	m := newSim(t, rs, clock, 2+r.IntN(2))
	type proc struct {
		p    *simProc
		keep *overrides.Keeper
		svc  *service.Service
		lags bool // has not applied the last change yet
	}
	var procs []*proc
	for _, p := range m.procs {
		k := overrides.New(rs.Overrides(), overrides.Options{Now: clock.Now})
		if err := k.Load(ctx); err != nil {
			t.Fatal(err)
		}
		svc := service.New(service.Options{Store: p.s, Overrides: k, StoreDoesIO: true})
		svc.SetConfig(cfg)
		procs = append(procs, &proc{p: p, keep: k, svc: svc})
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (RLS_TEST_SEED=%d replays it): %s", seed, seed, fmt.Sprintf(format, args...))
	}
	window := func(at time.Time) int64 { return at.UnixMicro() / time.Second.Microseconds() }
	// admitted and lag count the hits admitted per window, lag those by
	// processes that had not applied the change in force; ceiling is what
	// a window may admit but for lag (the limit, or more in the window of a
	// change: see TestOverrideBound).
	admitted, lag := map[int64]uint64{}, map[int64]uint64{}
	ceiling := map[int64]uint64{}
	current := overrideValues[0] // the value set last
	desc := string(engine.AppendDescriptorKey(nil, "api", []engine.Entry{{Key: "tenant", Value: "acme"}}, nil))
	mostOf := func(w int64) uint64 {
		if c, ok := ceiling[w]; ok {
			return c
		}
		return uint64(current)
	}
	var changes, denials int
	for step := range 2000 {
		pr := procs[r.IntN(len(procs))]
		switch x := r.IntN(100); {
		case x < 60: // a request
			hits := uint64(1 + r.IntN(3))
			req := &service.Request{Domain: "api", Descriptors: []service.Descriptor{{Entries: []engine.Entry{{Key: "tenant", Value: "acme"}}, HasHits: true, Hits: hits}}}
			resp, err := pr.svc.ShouldRateLimit(ctx, req)
			if err != nil {
				fail("step %d: %v", step, err)
			}
			if resp.Code != service.OK {
				denials++
				continue
			}
			w := window(clock.Now())
			admitted[w] += hits
			if pr.lags {
				lag[w] += hits
			}
			if admitted[w] > mostOf(w)+lag[w] {
				fail("step %d: %d hits admitted in window %d, more than %d (the limit, or the window of a change's ceiling) + %d (admitted by processes that had not applied it)",
					step, admitted[w], w, mostOf(w), lag[w])
			}
		case x < 78: // some of its takes and releases happen
			m.runTasks(pr.p, r, 1+r.IntN(3))
		case x < 86: // time passes
			span := 100_000
			if r.IntN(2) == 0 {
				span = 5_000
			}
			clock.Set(clock.Now().Add(time.Duration(r.IntN(span)) * time.Microsecond))
		case x < 92:
			pr.p.s.sweep(clock.Now())
		case x < 98: // a lagging process applies the change (its notice, or its poll)
			if pr.lags {
				if err := pr.keep.Load(ctx); err != nil {
					fail("step %d: %v", step, err)
				}
				pr.lags = false
			}
		default: // the first process sets an override, once all applied the last one
			lagging := false
			for _, p := range procs {
				lagging = lagging || p.lags
			}
			if lagging {
				continue
			}
			current = overrideValues[r.IntN(len(overrideValues))]
			now := clock.Now()
			w := window(now)
			// Hits held in slices the new value lets a process spend
			// (taken under a limit no higher): counted in the store, as if
			// admitted when taken.
			var held uint64
			for _, p := range procs {
				if c := p.p.s.lookup(desc, limit.Rule); c != nil {
					c.mu.Lock()
					if c.rule.Limit <= current {
						h, _ := c.grant.Held(now)
						held += h
					}
					c.mu.Unlock()
				}
			}
			c := overrides.Change{Key: overrides.Key{Domain: "api", Descriptor: []engine.Entry{{Key: "tenant", Value: "acme"}}}, RequestsPerUnit: current}
			if _, err := procs[0].keep.Set(ctx, c, "test"); err != nil {
				fail("step %d: %v", step, err)
			}
			changes++
			for _, p := range procs[1:] {
				p.lags = true
			}
			ceiling[w] = max(admitted[w]+held, uint64(current))
			for k := range ceiling {
				if k < w {
					delete(ceiling, k)
				}
			}
		}
	}
	st, _ := rs.DenyCacheStats()
	for _, p := range m.all {
		local += p.Stats().HitsLocal
	}
	t.Logf("%d changes, %d denials, %d from the denial cache, %d hits from slices", changes, denials, st.Hits, local)
	if changes == 0 || denials == 0 {
		t.Errorf("seed %d: %d changes, %d denials: the sequence tests too little", seed, changes, denials)
	}
	return st.Hits, local
}
