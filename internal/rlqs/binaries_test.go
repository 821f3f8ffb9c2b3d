package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/redistest"
)

// TestThreeEnvoysTwoRLSBinariesOnRedis: three emulated Envoys, each on a
// gRPC stream of its own, to two rls binaries sharing one Redis, in real
// time, asking 3 × a limit of 300 per 3 seconds between them (reporting
// every 200 ms, 1 s and 1 s: Envoy's 5 s would make the test long). In
// every whole window the requests admitted stay within the README's
// bound and reach 70% of the limit; clients are denied by assignment; an
// RLS ShouldRateLimit of the whole limit on the same descriptor is
// OVER_LIMIT (it sees the RLQS use; denied, it costs nothing); each
// binary's metrics count its grants.
func TestThreeEnvoysTwoRLSBinariesOnRedis(t *testing.T) {
	const (
		limit  = 300
		window = 3 * time.Second
	)
	srv := redistest.Start(t)
	cfg := fmt.Sprintf(`
domain: llm
descriptors:
  - key: model
    value: gpt
    rate_limit: {unit: second, unit_multiplier: 3, requests_per_unit: %d}
`, limit)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	procs := proctest.ServeN(t, 2, cfg, "--store", "redis", "--redis-url", srv.URL(), "--log-level", "warn", "--watch=false")
	var conns []*grpc.ClientConn
	for _, p := range procs {
		cc, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		conns = append(conns, cc)
	}
	var received sync.WaitGroup
	t.Cleanup(received.Wait)
	// envoyOn is an Envoy on a stream of its own to cc.
	envoyOn := func(cc *grpc.ClientConn, interval time.Duration, firstTick time.Time) *envoy {
		s, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.CloseSend() })
		e := newEnvoyOf(streamReporter{s}, interval, firstTick)
		received.Add(1)
		go func() {
			defer received.Done()
			receive(s, e)
		}()
		return e
	}

	seed := storetest.Seed(t)
	r := rand.New(rand.NewPCG(seed, 11))
	// Start just after a window turns (fixed windows are aligned to the
	// epoch), run three whole windows and stop 1.5 s into the fourth.
	start := time.Now().Truncate(window).Add(window)
	time.Sleep(time.Until(start))
	end := start.Add(3*window + window/2)
	envoys := []*envoy{
		envoyOn(conns[0], 200*time.Millisecond, start.Add(time.Duration(r.Int64N(200))*time.Millisecond)),
		envoyOn(conns[0], time.Second, start.Add(time.Duration(r.Int64N(1000))*time.Millisecond)),
		envoyOn(conns[1], time.Second, start.Add(time.Duration(r.Int64N(1000))*time.Millisecond)),
	}
	for _, e := range envoys {
		e.replaceKeepsRatio = true
	}
	gpt := map[string]string{"model": "gpt"}
	admitted := map[int64]int{}
	denied := 0
	// Each client asks 100 requests a second (the limit's rate): a request
	// every 10 ms on average.
	for now := time.Now(); now.Before(end); now = time.Now() {
		for _, e := range envoys {
			if r.IntN(2) == 0 {
				if e.request(ctx, "llm", gpt, now) {
					admitted[now.UnixNano()/int64(window)]++
				} else {
					denied++
				}
			}
			e.tick(ctx, "llm", now)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// The look, 1.5 s into the last window: the whole limit does not fit.
	look, err := rlsv3.NewRateLimitServiceClient(conns[1]).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: limit,
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "model", Value: "gpt"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if look.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("RLS asking the whole limit of model=gpt while RLQS clients use it: %v, want OVER_LIMIT", look.GetOverallCode())
	}

	// The bound: a second of each client's demand (at most 200 here, the
	// pace varies) per window, above the limit.
	bound := limit + len(envoys)*200
	first := start.UnixNano() / int64(window)
	for w := first; w < first+3; w++ {
		got := admitted[w]
		t.Logf("seed %d: window %d: %d admitted of %d (%.0f%%)", seed, w-first, got, limit, 100*float64(got)/limit)
		if got > bound {
			t.Errorf("seed %d: window %d: %d admitted, more than the limit %d and the bound (%d)", seed, w-first, got, limit, bound)
		}
		if got < limit*70/100 {
			t.Errorf("seed %d: window %d: %d admitted, less than 70%% of %d", seed, w-first, got, limit)
		}
	}
	if denied == 0 {
		t.Errorf("seed %d: no request denied by an assignment at 3 × the limit", seed)
	}
	for _, p := range procs {
		m, err := proctest.Samples("http://" + p.HTTPAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if m["rls_rlqs_granted_requests_total"] == 0 || m["rls_rlqs_buckets"] == 0 || m["rls_rlqs_streams"] == 0 {
			t.Errorf("%s: rls_rlqs_granted_requests_total %v, rls_rlqs_buckets %v, rls_rlqs_streams %v: want each above 0",
				p.Name(), m["rls_rlqs_granted_requests_total"], m["rls_rlqs_buckets"], m["rls_rlqs_streams"])
		}
	}
}
