package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

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
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: model
    value: free
`

// processes returns n rls "processes" (services with an RLQS server each)
// sharing one memory store on clock, with a limit of limit a minute on
// model=gpt.
func processes(t *testing.T, n int, limit int, clock *storetest.Clock) ([]*Server, engine.Store) {
	t.Helper()
	store := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(func() { store.Close() })
	return processesOn(t, n, limit, clock, func() engine.Store { return store }), store
}

// processesOn is processes on the stores that store returns, one per
// process.
func processesOn(t *testing.T, n int, limit int, clock *storetest.Clock, store func() engine.Store) []*Server {
	t.Helper()
	cfg, err := config.Parse("llm.yaml", []byte(fmt.Sprintf(testConfig, limit)))
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
	for _, demand := range []float64{3, 1.2} {
		t.Run(fmt.Sprintf("demand %.1f × the limit", demand), func(t *testing.T) {
			clock := storetest.NewClock(storetest.T0)
			servers, store := processes(t, 2, limit, clock)
			threeEnvoys(t, demand, clock, servers, store)
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
	servers := processesOn(t, 2, limit, clock, func() engine.Store {
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
	threeEnvoys(t, 3, clock, servers, first)
}

const limit = 6000 // a minute: 100 a second

func threeEnvoys(t *testing.T, demand float64, clock *storetest.Clock, servers []*Server, store engine.Store) {
	s := storetest.Seed(t)
	r := rand.New(rand.NewPCG(s, 7))
	ctx := context.Background()
	envoys := []*envoy{
		newEnvoy(servers[0], 200*time.Millisecond, clock.Now()),
		newEnvoy(servers[0], 5*time.Second, clock.Now()),
		newEnvoy(servers[1], 5*time.Second, clock.Now()),
	}
	gpt := map[string]string{"model": "gpt"}
	admitted := map[int64]int{}
	deniedByAssignment := 0
	const step = 10 * time.Millisecond
	for now := clock.Now(); now.Before(storetest.T0.Add(4 * time.Minute)); now = now.Add(step) {
		clock.Set(now)
		for _, e := range envoys {
			// Each client asks demand ÷ 3 × the limit: that many requests
			// per 10 ms step on average, in two draws.
			for range 2 {
				if r.Float64() >= demand/3/2 {
					continue
				}
				if e.request(ctx, "llm", gpt, now) {
					admitted[now.Unix()/60]++
				} else {
					deniedByAssignment++
				}
			}
			e.tick(ctx, "llm", now)
		}
	}
	// The bound: a grant given less than a second before a window ends
	// lasts a second into the next one: per client, at most a second of
	// its demand (here at most 200).
	bound := limit + len(envoys)*200
	for w := storetest.T0.Unix() / 60; w < storetest.T0.Unix()/60+4; w++ {
		got := admitted[w]
		t.Logf("seed %d: minute %d: %d admitted of %d (%.0f%%)", s, w-storetest.T0.Unix()/60, got, limit, 100*float64(got)/limit)
		if got > bound {
			t.Errorf("seed %d: minute %d: %d admitted, more than the limit %d and the bound (%d)", s, w, got, limit, bound)
		}
		if got < limit*70/100 {
			t.Errorf("seed %d: minute %d: %d admitted, less than 70%% of %d", s, w, got, limit)
		}
	}
	if deniedByAssignment == 0 {
		t.Errorf("seed %d: no request denied by an assignment at 3 × the limit", s)
	}
	// An RLS look sees the RLQS use.
	look := []engine.Item{{Desc: string(engine.AppendDescriptorKey(nil, "llm", []engine.Entry{{Key: "model", Value: "gpt"}}, nil)),
		Rule: engine.MustCompile(engine.Spec{Unit: engine.Minute, Multiplier: 1, Limit: limit})}}
	res := make([]engine.Result, 1)
	if _, err := store.Peek(ctx, look, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Remaining == limit {
		t.Errorf("the store's counter of model=gpt is untouched: RLS does not see the RLQS use")
	}
}

// A bucket without limits is told ALLOW_ALL; one that a reload removes
// from the config is abandoned.
func TestUnknownAndAbandonedBuckets(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	servers, _ := processes(t, 1, 100, clock)
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
