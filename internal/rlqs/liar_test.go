package rlqs

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
)

// TestLyingClients is the regression test of a client that spends its
// assignments as Envoy does but reports something else (it got 48,530
// requests in 10 s against 1,000 a minute by reporting allowed=0: each
// report "gave back" a grant it had spent). Each case runs a liar asking
// 1,000 requests a second for three minutes against 1,000 a minute,
// reporting at its own pace (every 10 ms, or Envoy's 5 s) with a seeded
// random lie; in every minute the requests admitted stay within the
// limit and the bound the README states for one client.
func TestLyingClients(t *testing.T) {
	lies := map[string]func(r *rand.Rand) func(allowed, denied uint64) (uint64, uint64){
		"allowed=0, the rest denied": func(*rand.Rand) func(uint64, uint64) (uint64, uint64) {
			return func(a, d uint64) (uint64, uint64) { return 0, a + d }
		},
		"nothing at all": func(*rand.Rand) func(uint64, uint64) (uint64, uint64) {
			return func(uint64, uint64) (uint64, uint64) { return 0, 0 }
		},
		"a random share of allowed": func(r *rand.Rand) func(uint64, uint64) (uint64, uint64) {
			return func(a, d uint64) (uint64, uint64) { return uint64(r.Float64() * float64(a)), d + a }
		},
		"2^64-1": func(*rand.Rand) func(uint64, uint64) (uint64, uint64) {
			return func(uint64, uint64) (uint64, uint64) { return math.MaxUint64, math.MaxUint64 }
		},
	}
	for name, lie := range lies {
		for _, interval := range []time.Duration{10 * time.Millisecond, 5 * time.Second} {
			t.Run(fmt.Sprintf("%s every %v", name, interval), func(t *testing.T) {
				w := window{"minute", engine.Minute, time.Minute, 1000}
				clock := storetest.NewClock(storetest.T0)
				servers, _ := processes(t, 1, w, clock)
				seed := storetest.Seed(t)
				r := rand.New(rand.NewPCG(seed, 5))
				ctx := context.Background()
				const step = 10 * time.Millisecond
				e := newEnvoy(servers[0], interval, storetest.T0.Add(time.Duration(r.Int64N(int64(interval/step)))*step))
				e.lie = lie(r)
				gpt := map[string]string{"model": "gpt"}
				admitted := map[int64]int{}
				for now := storetest.T0; now.Before(storetest.T0.Add(3 * time.Minute)); now = now.Add(step) {
					clock.Set(now)
					e.tick(ctx, "llm", now)
					for range 10 {
						if e.request(ctx, "llm", gpt, now) {
							admitted[now.UnixNano()/int64(time.Minute)]++
						}
					}
				}
				first := storetest.T0.UnixNano() / int64(time.Minute)
				bound := w.limit + e.overBound()
				for m := first; m < first+3; m++ {
					t.Logf("seed %d: minute %d: %d admitted of %d", seed, m-first, admitted[m], w.limit)
					if admitted[m] > bound {
						t.Errorf("seed %d: minute %d: a lying client got %d admitted, more than the limit %d and the bound (%d)", seed, m-first, admitted[m], w.limit, bound)
					}
				}
				m := servers[0].metrics
				for _, c := range []struct {
					name string
					got  float64
				}{
					{"rls_rlqs_requests_reported_total{result=allowed}", testutil.ToFloat64(m.allowed)},
					{"rls_rlqs_requests_reported_total{result=denied}", testutil.ToFloat64(m.denied)},
				} {
					// A report counts at most a million requests a second of
					// its interval.
					if most := 1e6 * (3*time.Minute + interval + time.Second).Seconds(); c.got > most {
						t.Errorf("seed %d: %s = %g, more than a million a second over the run (%g)", seed, c.name, c.got, most)
					}
				}
			})
		}
	}
}
