package rlqs

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/service"
)

const testConfig = `
domain: llm
descriptors:
  - key: model
    value: gpt
    rate_limit: {unit: %s, requests_per_unit: %d}
  - key: model
    value: free
`

// window is the limit on model=gpt of a test.
type window struct {
	unit  string // of the config
	eunit engine.Unit
	d     time.Duration
	limit int
}

// The limits of the tests: a minute's (Envoy's 5 s reports fit in its
// windows) and a second's (every grant's whole-second TTL outlives the
// window it was taken in: the README's spill bound).
var (
	perMinute = window{"minute", engine.Minute, time.Minute, 6000} // 100 a second
	perSecond = window{"second", engine.Second, time.Second, 100}
)

// processes returns n rls "processes" (services with an RLQS server each)
// sharing one memory store on clock, with the limit w on model=gpt.
func processes(t *testing.T, n int, w window, clock *storetest.Clock) ([]*Server, engine.Store) {
	t.Helper()
	store := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(func() { store.Close() })
	return processesOn(t, n, w, clock, func() engine.Store { return store }), store
}

// processesOn is processes on the stores that store returns, one per
// process.
func processesOn(t *testing.T, n int, w window, clock *storetest.Clock, store func() engine.Store) []*Server {
	t.Helper()
	cfg, err := config.Parse("llm.yaml", []byte(fmt.Sprintf(testConfig, w.unit, w.limit)))
	if err != nil {
		t.Fatal(err)
	}
	var out []*Server
	for range n {
		svc := service.New(service.Options{Store: store()})
		svc.SetConfig(cfg)
		out = append(out, New(svc, Options{Now: clock.Now}))
	}
	return out
}

// TestThreeEnvoysTwoProcesses: three emulated Envoys on two rls processes
// sharing a store (one reporting every 200 ms, two every 5 s, Envoy's
// pace today), asking 3 × and 1.2 × the limit between them: in every
// minute window the requests admitted stay within the limit plus the
// README's bound, and reach at least 70% of it; once the limit is spent
// the clients are denied by their assignments; an RLS look at the
// descriptor sees the RLQS use. Demand is random (seeded).
func TestThreeEnvoysTwoProcesses(t *testing.T) {
	for _, c := range []struct {
		demand     float64
		keepsRatio bool
	}{{3, false}, {1.2, false}, {3, true}, {1.2, true}} {
		t.Run(fmt.Sprintf("demand %.1f × the limit, replacement keeps the ratio %v", c.demand, c.keepsRatio), func(t *testing.T) {
			demand := c.demand
			clock := storetest.NewClock(storetest.T0)
			servers, store := processes(t, 2, perMinute, clock)
			seed := storetest.Seed(t)
			run := threeEnvoys(t, seed, perMinute, demand, c.keepsRatio, clock, servers, store)
			checkWindows(t, seed, perMinute, run, true)
			m := servers[0].metrics
			if got := testutil.ToFloat64(m.granted); got == 0 {
				t.Errorf("rls_rlqs_granted_requests_total is 0")
			}
			if got := testutil.ToFloat64(m.actions.WithLabelValues(actionDenyAll)); demand > 2 && got == 0 {
				t.Errorf("rls_rlqs_actions_total{action=deny_all} is 0 at %.1f × the limit", demand)
			}
			if got := testutil.ToFloat64(m.buckets); got != 2 {
				t.Errorf("rls_rlqs_buckets of the first process: %v, want 2 (two Envoys, a bucket each)", got)
			}
		})
	}
}

// TestThreeEnvoysTwoProcessesOnRedis is TestThreeEnvoysTwoProcesses with
// each process on a Redis store of its own, on one Redis (at the test
// clock: the scripts decide at its instants).
func TestThreeEnvoysTwoProcessesOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	var first *redisstore.Store
	servers := processesOn(t, 2, perMinute, clock, func() engine.Store {
		rs, err := redisstore.New(redisstore.Options{URL: srv.URL(), Now: clock.Now, Prefix: "rlqs:"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		if first == nil {
			first = rs
		}
		return rs
	})
	seed := storetest.Seed(t)
	checkWindows(t, seed, perMinute, threeEnvoys(t, seed, perMinute, 3, true, clock, servers, first), true)
}

// threeEnvoys runs three emulated Envoys on servers (two processes) for
// four minutes of the test clock, one reporting every 200 ms and two at
// Envoy's 5 s, asking demand × w's limit between them, and returns the
// requests admitted in each window of w, by its number. keepsRatio: the
// Envoys start a replacing token bucket with the replaced one's ratio of
// tokens left (later versions), not full. An RLS look at the descriptor
// sees the RLQS use.
func threeEnvoys(t *testing.T, s uint64, w window, demand float64, keepsRatio bool, clock *storetest.Clock, servers []*Server, store engine.Store) fleetRun {
	t.Helper()
	run := runFleet(t, s, w, fleet{
		intervals: []time.Duration{200 * time.Millisecond, 5 * time.Second, 5 * time.Second},
		process:   []int{0, 0, 1},
		demand:    demand, keepsRatio: keepsRatio, duration: 4 * time.Minute,
	}, clock, servers)
	if demand > 1 && run.deniedByAssignment == 0 {
		t.Errorf("seed %d: no request denied by an assignment at %.1f × the limit", s, demand)
	}
	// An RLS look sees the RLQS use.
	look := []engine.Item{{Desc: string(engine.AppendDescriptorKey(nil, "llm", []engine.Entry{{Key: "model", Value: "gpt"}}, nil)),
		Rule: engine.MustCompile(engine.Spec{Unit: w.eunit, Multiplier: 1, Limit: uint32(w.limit)})}}
	res := make([]engine.Result, 1)
	if _, err := store.Peek(context.Background(), look, res); err != nil {
		t.Fatal(err)
	}
	if int(res[0].Remaining) == w.limit {
		t.Errorf("the store's counter of model=gpt is untouched: RLS does not see the RLQS use")
	}
	return run
}

// fleet is a run of emulated Envoys on model=gpt of domain llm.
type fleet struct {
	intervals  []time.Duration // the reporting interval of each Envoy
	process    []int           // the server each Envoy reports to
	demand     float64         // what they ask between them, × the limit
	keepsRatio bool            // Envoy.replaceKeepsRatio
	duration   time.Duration   // from storetest.T0
}

// fleetRun is what a fleet's run saw.
type fleetRun struct {
	admitted           map[int64]int // by window number
	asked              map[int64]int
	deniedByAssignment int
	// over is the README's bound on what a window admits above the
	// limit: the sum of the Envoys' overBound.
	over int
}

// runFleet runs f's Envoys on the test clock in steps of 10 ms, each
// asking demand ÷ n × w's limit, at random instants (seeded by s), with
// its reporting ticks at a random phase of its interval.
func runFleet(t *testing.T, s uint64, w window, f fleet, clock *storetest.Clock, servers []*Server) fleetRun {
	t.Helper()
	r := rand.New(rand.NewPCG(s, 7))
	ctx := context.Background()
	const step = 10 * time.Millisecond
	var envoys []*envoy
	for i, d := range f.intervals {
		phase := clock.Now().Add(time.Duration(r.Int64N(int64(d/step))) * step)
		e := newEnvoy(servers[f.process[i]], d, phase)
		e.replaceKeepsRatio = f.keepsRatio
		envoys = append(envoys, e)
	}
	// Each client's requests a step, in draws of probability p.
	perStep := f.demand / float64(len(envoys)) * float64(w.limit) * float64(step) / float64(w.d)
	draws := int(math.Ceil(perStep)) + 1
	p := perStep / float64(draws)
	gpt := map[string]string{"model": "gpt"}
	run := fleetRun{admitted: map[int64]int{}, asked: map[int64]int{}}
	for now := clock.Now(); now.Before(storetest.T0.Add(f.duration)); now = now.Add(step) {
		clock.Set(now)
		n := now.UnixNano() / int64(w.d)
		for _, e := range envoys {
			e.tick(ctx, "llm", now)
			for range draws {
				if r.Float64() >= p {
					continue
				}
				run.asked[n]++
				if e.request(ctx, "llm", gpt, now) {
					run.admitted[n]++
				} else {
					run.deniedByAssignment++
				}
			}
		}
	}
	for _, e := range envoys {
		run.over += e.overBound()
	}
	for i, srv := range servers {
		checkLedger(t, s, i, srv)
	}
	return run
}

// checkLedger checks that the grant ledger of process i accounts for every
// token it took: spent (by its clients, as far as it can tell), held,
// released or lapsed, none in flight (releases are sent in the report or
// tick that makes them), no term past what was taken.
func checkLedger(t *testing.T, s uint64, i int, srv *Server) {
	t.Helper()
	c := srv.ledger.Counts()
	sum := c.Spent + c.Held + c.Releasing + c.Released + c.Lapsed
	if sum != c.Taken || c.Releasing != 0 || max(c.Spent, c.Held, c.Released, c.Lapsed) > c.Taken {
		t.Errorf("seed %d: process %d's grant ledger %+v: spent + held + releasing + released + lapsed = %d, want the %d taken, none releasing",
			s, i, c, sum, c.Taken)
	}
}

// checkWindows checks every whole window of a fleet's run: at most the
// limit and its bound admitted, and at least 70% of the limit: in every
// window when eachWindow, else on average.
func checkWindows(t *testing.T, s uint64, w window, run fleetRun, eachWindow bool) {
	t.Helper()
	first := storetest.T0.UnixNano() / int64(w.d)
	n := int64(4 * time.Minute / w.d)
	sum, bound := 0, w.limit+run.over
	for i := first; i < first+n; i++ {
		got := run.admitted[i]
		sum += got
		if w.d == time.Minute {
			t.Logf("seed %d: minute %d: %d admitted of %d (%.0f%%)", s, i-first, got, w.limit, 100*float64(got)/float64(w.limit))
		}
		if got > bound {
			t.Errorf("seed %d: %s %d: %d admitted, more than the limit %d and the bound (%d)", s, w.unit, i-first, got, w.limit, bound)
		}
		if eachWindow && got < w.limit*70/100 {
			t.Errorf("seed %d: %s %d: %d admitted, less than 70%% of %d", s, w.unit, i-first, got, w.limit)
		}
	}
	if mean := float64(sum) / float64(n); mean < float64(w.limit)*0.7 {
		t.Errorf("seed %d: %.1f admitted a %s on average, less than 70%% of %d", s, mean, w.unit, w.limit)
	}
}

// A bucket without limits is told ALLOW_ALL; one that a reload removes
// from the config is abandoned.
func TestUnknownAndAbandonedBuckets(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	servers, _ := processes(t, 1, window{"minute", engine.Minute, time.Minute, 100}, clock)
	ss := servers[0].NewSession()
	ctx := context.Background()
	report := func(bucket map[string]string) string {
		resp, err := ss.Report(ctx, reportOf("llm", bucket, 1))
		if err != nil {
			t.Fatal(err)
		}
		a := resp.GetBucketAction()[0]
		if a.GetAbandonAction() != nil {
			return "abandon"
		}
		st := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
		if st.GetTokenBucket() != nil {
			return "token_bucket"
		}
		return st.GetBlanketRule().String()
	}
	for _, c := range []struct {
		bucket map[string]string
		want   string
	}{
		{map[string]string{"model": "free"}, "ALLOW_ALL"},  // a node without limits
		{map[string]string{"model": "other"}, "ALLOW_ALL"}, // no node
		{map[string]string{"user": "u"}, "ALLOW_ALL"},      // no key
		{map[string]string{"model": "gpt"}, "token_bucket"},
	} {
		if got := report(c.bucket); got != c.want {
			t.Errorf("bucket %v: %s, want %s", c.bucket, got, c.want)
		}
	}
	cfg, err := config.Parse("llm.yaml", []byte("domain: llm\ndescriptors:\n  - key: model\n"))
	if err != nil {
		t.Fatal(err)
	}
	servers[0].svc.SetConfig(cfg)
	if got := report(map[string]string{"model": "gpt"}); got != "abandon" {
		t.Errorf("bucket model=gpt after its limit is removed: %s, want abandon", got)
	}
}

func reportOf(domain string, bucket map[string]string, allowed uint64) *rlqsv3.RateLimitQuotaUsageReports {
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: bucket}, NumRequestsAllowed: allowed}}}
}

// tokenBucketOf is the token bucket of resp's last action, nil when it has
// none.
func tokenBucketOf(resp *rlqsv3.RateLimitQuotaResponse) *typev3.TokenBucket {
	as := resp.GetBucketAction()
	if len(as) == 0 {
		return nil
	}
	return as[len(as)-1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
}
