package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

// TestShippedExampleAtEnvoysPace is the regression test of a client under
// its limit denied most of the time: the shipped example's bucket
// (envoy/envoy-rlqs.yaml: {api_key: <key>}, config/limits.yaml: a token
// bucket of 50 a second holding 100, and 100,000 a day), one Envoy
// reporting every 5 s as Envoy does, its client asking 12 requests a
// second at random instants for two minutes: the limit admits them all,
// so nearly all must pass.
func TestShippedExampleAtEnvoysPace(t *testing.T) {
	cfg, err := config.Load("../../config/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(storetest.T0)
	store := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(func() { store.Close() })
	svc := service.New(service.Options{Store: store})
	svc.SetConfig(cfg)
	srv := New(svc, Options{Now: clock.Now})

	seed := storetest.Seed(t)
	r := rand.New(rand.NewPCG(seed, 4))
	ctx := context.Background()
	const step = 10 * time.Millisecond
	e := newEnvoy(srv, 5*time.Second, storetest.T0.Add(time.Duration(r.Int64N(500))*step))
	key := map[string]string{"api_key": "k1"}
	asked, admitted := 0, 0
	for now := storetest.T0; now.Before(storetest.T0.Add(2 * time.Minute)); now = now.Add(step) {
		clock.Set(now)
		e.tick(ctx, "api", now)
		if r.Float64() < 12*step.Seconds() { // 12 a second
			asked++
			if e.request(ctx, "api", key, now) {
				admitted++
			}
		}
	}
	share := float64(admitted) / float64(asked)
	t.Logf("seed %d: %d of %d requests admitted (%.1f%%) at 12 a second under 50 a second", seed, admitted, asked, 100*share)
	if share < 0.95 {
		t.Errorf("seed %d: %d of %d requests admitted (%.1f%%) at 12 a second under a limit of 50 a second: want at least 95%%", seed, admitted, asked, 100*share)
	}
}

// TestShortWindowsAtEnvoysPace: windows shorter than Envoy's reporting
// interval. Three emulated Envoys on two processes, all reporting every
// 5 s as Envoy does (or one every 200 ms, as a gRPC client may), asking
// 0.5, 1.2 and 3 × a limit of 100 a second between them (seeded), with
// both of Envoy's ways of replacing a token bucket: in every second the
// requests admitted stay within the limit plus the README's bound, and
// on average they reach 92% of what was asked under the limit, 70% of the
// limit above it. The figures are logged.
func TestShortWindowsAtEnvoysPace(t *testing.T) {
	paces := map[string][]time.Duration{
		"5 s, 5 s, 5 s":    {5 * time.Second, 5 * time.Second, 5 * time.Second},
		"200 ms, 5 s, 5 s": {200 * time.Millisecond, 5 * time.Second, 5 * time.Second},
	}
	for name, intervals := range paces {
		for _, demand := range []float64{0.5, 1.2, 3} {
			for _, keepsRatio := range []bool{false, true} {
				t.Run(fmt.Sprintf("reports every %s, demand %.1f × the limit, replacement keeps the ratio %v", name, demand, keepsRatio), func(t *testing.T) {
					clock := storetest.NewClock(storetest.T0)
					servers, _ := processes(t, 2, perSecond, clock)
					seed := storetest.Seed(t)
					run := runFleet(t, seed, perSecond, fleet{
						intervals: intervals, process: []int{0, 0, 1},
						demand: demand, keepsRatio: keepsRatio, duration: 2 * time.Minute,
					}, clock, servers)
					bound := perSecond.limit + run.over
					first := storetest.T0.Unix()
					n := int64(2 * time.Minute / time.Second)
					var admitted, asked, worst, over int
					for i := first; i < first+n; i++ {
						got := run.admitted[i]
						admitted += got
						asked += run.asked[i]
						worst = max(worst, got)
						if got > perSecond.limit {
							over++
						}
						if got > bound {
							t.Errorf("seed %d: second %d: %d admitted, more than the limit %d and the bound (%d)", seed, i-first, got, perSecond.limit, bound)
						}
					}
					mean := float64(admitted) / float64(n)
					t.Logf("seed %d: %d of %d asked admitted (%.1f%%), on average %.1f a second of %d; %d seconds above the limit, the most %d (the bound %d)",
						seed, admitted, asked, 100*float64(admitted)/float64(asked), mean, perSecond.limit, over, worst, bound)
					if demand < 1 {
						if share := float64(admitted) / float64(asked); share < 0.92 {
							t.Errorf("seed %d: %.1f%% of the requests asked admitted under the limit, want 92%%", seed, 100*share)
						}
					} else if mean < 0.7*float64(perSecond.limit) {
						t.Errorf("seed %d: %.1f admitted a second on average, less than 70%% of %d", seed, mean, perSecond.limit)
					}
				})
			}
		}
	}
}

// TestTickAtWindowTurn: between reports the server pays each new window
// of a token bucket's fill; when the window cannot pay, it pushes what
// fits (here nothing: DENY_ALL until the window turns), and when the
// next window can, a token bucket again. A step table on the test clock
// (a limit of 100 a second, RLS clients spending it in between).
func TestTickAtWindowTurn(t *testing.T) {
	clock := storetest.NewClock(storetest.T0.Add(500 * time.Millisecond))
	servers, _ := processes(t, 1, perSecond, clock)
	ss := servers[0].NewSession()
	ctx := context.Background()
	gpt := map[string]string{"model": "gpt"}
	spend := func() {
		for {
			r, err := servers[0].svc.ShouldRateLimit(ctx, &service.Request{Domain: "llm", Descriptors: []service.Descriptor{
				{Entries: []config.Entry{{Key: "model", Value: "gpt"}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Code != service.OK {
				return
			}
		}
	}
	kind := func(resp *rlqsv3.RateLimitQuotaResponse) string {
		as := resp.GetBucketAction()
		if len(as) == 0 {
			return "nothing"
		}
		st := as[len(as)-1].GetQuotaAssignmentAction().GetRateLimitStrategy()
		if st.GetTokenBucket() != nil {
			return "token_bucket"
		}
		return st.GetBlanketRule().String()
	}
	steps := []struct {
		at    time.Duration // after T0
		spend bool          // RLS clients spend what the window has left first
		tick  bool          // Tick, else a report
		want  string
	}{
		{at: 500 * time.Millisecond, want: "token_bucket"},                       // the first report
		{at: 1000 * time.Millisecond, tick: true, want: "nothing"},               // the next window pays its fill
		{at: 2000 * time.Millisecond, spend: true, tick: true, want: "DENY_ALL"}, // spent before the tick: nothing fits
		{at: 3000 * time.Millisecond, tick: true, want: "token_bucket"},          // a new window has room
	}
	for i, st := range steps {
		clock.Set(storetest.T0.Add(st.at))
		if st.spend {
			spend()
		}
		var resp *rlqsv3.RateLimitQuotaResponse
		var err error
		if st.tick {
			resp, err = ss.Tick(ctx)
		} else {
			resp, err = ss.Report(ctx, reportOf("llm", gpt, 1))
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := kind(resp); got != st.want {
			t.Errorf("step %d (T0+%v, tick %v): %s, want %s", i, st.at, st.tick, got, st.want)
		}
		if next, ok := ss.NextTick(); !ok || !next.After(storetest.T0.Add(st.at)) {
			t.Errorf("step %d: next tick %v (%v), want one after T0+%v", i, next, ok, st.at)
		}
	}
}
