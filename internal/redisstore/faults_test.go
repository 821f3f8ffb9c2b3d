package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

// everyAlgorithm returns one item per algorithm, each on its own counter of
// desc, with a limit of 100 (burst 100).
func everyAlgorithm(desc string, hits uint64) []engine.Item {
	var items []engine.Item
	for _, alg := range storetest.Algorithms() {
		burst := uint32(0)
		if alg == descriptors.TokenBucket {
			burst = 100
		}
		items = append(items, engine.Item{Desc: desc, Limit: storetest.Limit(alg, 100, time.Hour, burst), Hits: hits})
	}
	return items
}

// lookFull fails unless every counter of items still admits its whole limit.
func lookFull(t *testing.T, s *Store, items []engine.Item, what string) {
	t.Helper()
	look := make([]engine.Item, len(items))
	for i := range items {
		look[i] = items[i]
		look[i].Hits = 0
	}
	results := make([]engine.Result, len(look))
	if _, err := s.Apply(context.Background(), look, results); err != nil {
		t.Fatalf("%s: a look: %v", what, err)
	}
	for i, r := range results {
		if l := look[i].Limit; r.Remaining != uint64(l.RequestsPerUnit) {
			t.Errorf("%s: %s remaining %d, want the whole limit %d (a request rls did not answer consumed)", what, l.Algorithm, r.Remaining, l.RequestsPerUnit)
		}
	}
}

// starvedBound is the pipeline bound of the tests that count each
// request's outcome: on a machine starved by the race detector and other
// tests, a reply can come after the default 100 ms, and the store then
// rightly counts it as indeterminate.
const starvedBound = time.Second

// settle waits for what the store does after its callers have their
// answers: late replies read (a pipeline is waited for pipelineBound at
// most) and given back.
func settle(t *testing.T, s *Store) {
	t.Helper()
	time.Sleep(pipelineBound(s.opts))
	s.releasing.Wait()
}

// TestSlowNetworkConsumesNothing: with 15 ms added each way and a 10 ms
// store timeout, every request reaches Redis past its deadline: each fails,
// Redis decides none, and once the network heals every counter still has
// its whole limit (the 120 sequential requests).
func TestSlowNetworkConsumesNothing(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	s := newStore(t, Options{URL: "redis://" + proxy.Addr() + "/0", Timeout: 10 * time.Millisecond, minPipelineBound: starvedBound})
	items := everyAlgorithm("d/k=slow", 1)
	lookFull(t, s, items, "before the fault") // and the connections are up

	proxy.SetLatency(15 * time.Millisecond)
	results := make([]engine.Result, len(items))
	for i := range 120 {
		if ok, err := s.Apply(context.Background(), items, results); err == nil {
			t.Fatalf("request %d through 30 ms of round trip with a 10 ms timeout = %v, want an error", i, ok)
		}
	}
	proxy.Heal()
	settle(t, s)
	lookFull(t, s, items, "after 120 requests past their deadline")
	st := s.Stats()
	if st.Expired != 120 || st.Indeterminate != 0 {
		t.Errorf("Stats() = %+v, want 120 expired (Redis said so), 0 indeterminate", st)
	}
}

// TestLateReplyGivenBack: replies that come after their callers stopped
// waiting are given back. With an 80 ms store timeout, requests reach Redis
// 50 ms after they leave, in the last half of their deadline (so they are
// decided with their undo logs), and replies take 80 ms back, past the
// callers' wait (deadline plus half a timeout). While the fault lasts, the
// bound of Redis's clock lead (read from replies that take 80 ms back)
// drops by as much, so some requests are sent with an earlier deadline and
// expire instead: never later, never consuming.
func TestLateReplyGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	s := newStore(t, Options{URL: "redis://" + proxy.Addr() + "/0", Timeout: 80 * time.Millisecond, minPipelineBound: starvedBound})
	items := everyAlgorithm("d/k=late", 3)
	lookFull(t, s, items, "before the fault")

	proxy.SetLatency(50 * time.Millisecond)
	proxy.SetReplyDelay(30 * time.Millisecond)
	results := make([]engine.Result, len(items))
	const n = 12
	for i := range n {
		if _, err := s.Apply(context.Background(), items, results); err == nil {
			t.Fatalf("request %d: answered within the wait over 130 ms of round trip", i)
		}
	}
	proxy.Heal()
	settle(t, s)
	lookFull(t, s, items, "after late replies")
	st := s.Stats()
	if st.GivenBack+st.Expired != n || st.GivenBack == 0 || st.Indeterminate != 0 {
		t.Errorf("Stats() = %+v, want %d given back or expired, some given back, none indeterminate", st, n)
	}
}

// TestCutRepliesRunOnce: the connection is reset after every other reply
// left Redis (the request ran, its caller never hears of it). No request
// runs twice: 300 requests of 1 hit consume at most 300, on one node and
// on a cluster (whose client library would otherwise send the pipeline
// again), and each cut is counted as indeterminate.
func TestCutRepliesRunOnce(t *testing.T) {
	check := func(t *testing.T, s *Store, cuts func() int, heal func()) {
		items := []engine.Item{{Desc: "d/k=cut", Limit: storetest.Limit(descriptors.FixedWindow, 1000, time.Hour, 0), Hits: 1}}
		results := make([]engine.Result, 1)
		failed := 0
		for range 300 {
			if _, err := s.Apply(context.Background(), items, results); err != nil {
				failed++
			}
		}
		heal()
		settle(t, s)
		items[0].Hits = 0
		if _, err := s.Apply(context.Background(), items, results); err != nil {
			t.Fatal(err)
		}
		consumed := 1000 - results[0].Remaining
		st := s.Stats()
		t.Logf("300 requests: %d failed, %d consumed, %d cuts, %+v", failed, consumed, cuts(), st)
		if consumed > 300 {
			t.Errorf("300 requests of one hit consumed %d: some ran twice", consumed)
		}
		if failed == 0 || consumed < uint64(300-failed) {
			t.Errorf("%d failed, %d consumed: the cuts did not happen, or answered requests were not counted", failed, consumed)
		}
		if st.Indeterminate < uint64(failed) {
			t.Errorf("indeterminate %d, want every failed request (%d) counted", st.Indeterminate, failed)
		}
	}
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		proxy := redistest.StartFaultProxy(t, srv.Addr())
		s := newStore(t, Options{URL: "redis://" + proxy.Addr() + "/0", Timeout: 100 * time.Millisecond})
		lookFull(t, s, everyAlgorithm("d/k=warm", 0), "warming up")
		proxy.CutEveryReply(2, "FCALL")
		check(t, s, proxy.Cuts, proxy.Heal)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartProxiedCluster(t, 3)
		s := newStore(t, Options{ClusterSeeds: c.Seeds(), Timeout: 100 * time.Millisecond})
		lookFull(t, s, everyAlgorithm("d/k=warm", 0), "warming up")
		for _, p := range c.Proxies {
			p.CutEveryReply(2, "FCALL")
		}
		check(t, s, func() int {
			n := 0
			for _, p := range c.Proxies {
				n += p.Cuts()
			}
			return n
		}, func() {
			for _, p := range c.Proxies {
				p.Heal()
			}
		})
	})
}
