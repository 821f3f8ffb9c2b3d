package redisconn

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
)

// oneHit is a request of one hit on a fixed window of a million an hour:
// admitted whenever Redis decides it.
func oneHit(desc string) []engine.Item {
	return []engine.Item{{Desc: desc, Rule: storetest.Rule(engine.FixedWindow, 1_000_000, time.Hour, 0), Hits: 1}}
}

// TestTLSFirstCallAfterReady: a store started against Redis over TLS, warmed
// and ready (Ping), decides its first call within the default 10 ms store
// timeout, at each of 12 cold starts. The pipelines took their connections
// from go-redis's pipeline pool, which Warm had not connected: the first
// call dialed and made its TLS handshake after its deadline in Redis's
// clock was set, and 4 of 12 cold starts failed with "no reply within the
// store timeout", once after /readyz said 200 (under the race detector,
// 12 of 12).
func TestTLSFirstCallAfterReady(t *testing.T) {
	files := testpki.New(t)
	srv := redistest.StartWith(t, redistest.Config{TLS: files})
	for i := range 12 {
		s, err := New(Options{URL: "rediss://" + srv.Addr() + "/0", CAFile: files.CA}) // the default store timeout, 10 ms
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.Warm(ctx); err != nil {
			t.Fatalf("cold start %d: Warm: %v", i, err)
		}
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("cold start %d: Ping after Warm: %v", i, err)
		}
		cancel()
		if _, err := s.Apply(context.Background(), oneHit("d/k=first"), make([]engine.Result, 1)); err != nil {
			t.Errorf("cold start %d: the first call after ready: %v", i, err)
		}
		// Every worker's connection was set up by Warm, and the call
		// set none up.
		if n := s.links.setups.Load(); n != uint64(s.opts.Workers) {
			t.Errorf("cold start %d: %d connections set up, want %d (one per worker, all by Warm)", i, n, s.opts.Workers)
		}
		s.Close()
	}
}

// refusedBound is how soon a call to a Redis that refuses connections
// must fail, with a store timeout of 2 s: a tenth of it. go-redis dialed
// five times with 100 ms pauses inside each call, 0.41 s; a call now
// costs a look at the node's state (measured: see the README).
const refusedBound = 200 * time.Millisecond

// failsFast makes n calls of items to s and fails the test unless each
// fails within refusedBound.
func failsFast(t *testing.T, s *Store, items []engine.Item, n int, what string) {
	t.Helper()
	for i := range n {
		start := time.Now()
		_, err := s.Apply(context.Background(), items, make([]engine.Result, len(items)))
		if d := time.Since(start); err == nil || d > refusedBound {
			t.Errorf("%s: call %d: %v after %s; want an error well before the 2 s store timeout (within %s)", what, i, err, d, refusedBound)
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err == nil || time.Since(start) > refusedBound {
		t.Errorf("%s: Ping: %v after %s; want an error within %s", what, err, time.Since(start), refusedBound)
	}
}

// TestRefusedRedisFailsFast: with nothing listening at Redis's address
// from the start (connection refused) and a store timeout of 2 s, every
// call and Ping fails well before the timeout.
func TestRefusedRedisFailsFast(t *testing.T) {
	s := newStore(t, Options{URL: "redis://" + servetest.Addr(t) + "/0", Timeout: 2 * time.Second})
	failsFast(t, s, oneHit("d/k=refused"), 20, "nothing listening")
	if st := s.Stats(); st.Indeterminate != 0 || st.Expired != 0 {
		t.Errorf("Stats() = %+v, want nothing sent: no indeterminate or expired request", st)
	}
}

// TestKilledRedisFailsFastAndComesBack: Redis killed mid-run (its port
// then refuses connections): every call fails well before the 2 s store
// timeout, nothing is sent to it, and once Redis is restarted on its port
// the store reconnects by itself, with no call asking it to.
func TestKilledRedisFailsFastAndComesBack(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL(), Timeout: 2 * time.Second})
	items := oneHit("d/k=killed")
	if _, err := s.Apply(context.Background(), items, make([]engine.Result, 1)); err != nil {
		t.Fatalf("before the kill: %v", err)
	}
	st0 := s.Stats()
	srv.Kill()
	failsFast(t, s, items, 20, "Redis killed")
	if st := s.Stats(); st.Indeterminate != st0.Indeterminate {
		t.Errorf("Stats() = %+v (before the kill: %+v), want nothing sent to the killed Redis", st, st0)
	}
	srv.Restart()
	for deadline := time.Now().Add(10 * time.Second); s.links.downErr("") != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Redis restarted, no call: still down 10 s later: %v", s.links.downErr(""))
		}
	}
	waitDecided(t, s, items, "after the restart")
}

// waitDecided asks items until Redis decides them, for 10 s at most: the
// store reconnects in the background.
func waitDecided(t *testing.T, s *Store, items []engine.Item, what string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = s.Ping(ctx)
		cancel()
		if err != nil {
			continue
		}
		if _, err = s.Apply(context.Background(), items, make([]engine.Result, len(items))); err == nil {
			return
		}
	}
	t.Fatalf("%s: not decided within 10 s: %v", what, err)
}

// TestClusterKilledMasterFailsFast: a master of a cluster without replicas
// killed: calls to its slots fail well before the 2 s store timeout, calls
// to the other masters are decided, and once the master is restarted (it
// rejoins with its slots) its calls are decided again without a new store.
func TestClusterKilledMasterFailsFast(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	s := newStore(t, Options{ClusterSeeds: c.Seeds(), Timeout: 2 * time.Second})
	l := oneHit("x")[0].Rule
	descs := descsOnDistinctMasters(t, c, s, l, 2)
	victim, other := oneHit(descs[0]), oneHit(descs[1])
	for _, items := range [][]engine.Item{victim, other} {
		if _, err := s.Apply(context.Background(), items, make([]engine.Result, 1)); err != nil {
			t.Fatalf("before the kill: %v", err)
		}
	}
	master := c.Master(c.KeySlot(s.base(&victim[0])))
	master.Kill()
	failsFast(t, s, victim, 20, "a master killed")
	for i := range 5 {
		if _, err := s.Apply(context.Background(), other, make([]engine.Result, 1)); err != nil {
			t.Errorf("call %d to a master still up: %v", i, err)
		}
	}
	master.Restart()
	c.WaitHealthy()
	waitDecided(t, s, victim, "after the master's restart")
}

// TestNewConnectionNotChargedToTheCall: a call whose connection was reset
// mid-run needs a new one, whose setup takes 300 ms (a slow TLS handshake,
// a far server), three times the store timeout: the call is decided, as
// the connection is set up before its deadline is stamped. The pipelines
// dialed after it: the call reached Redis past its deadline, or its caller
// had stopped waiting. On a single node and in a cluster, with the calls
// of a request on three masters.
func TestNewConnectionNotChargedToTheCall(t *testing.T) {
	const timeout, hold = 100 * time.Millisecond, 300 * time.Millisecond
	check := func(t *testing.T, s *Store, proxies []*redistest.FaultProxy, items []engine.Item) {
		t.Helper()
		lookFull(t, s, items, "before the reset")
		accepted := 0
		for _, p := range proxies {
			p.SetConnectDelay(hold)
			p.ResetConnections()
			accepted += p.Accepted()
		}
		st0 := s.Stats()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := s.Apply(ctx, items, make([]engine.Result, len(items))); err != nil {
			t.Errorf("the call after its connection was reset: %v", err)
		}
		after := 0
		for _, p := range proxies {
			after += p.Accepted()
			p.Heal()
		}
		if after == accepted {
			t.Error("no connection was made after the reset: the test did not exercise a new connection")
		}
		if st := s.Stats(); st.Expired != st0.Expired || st.Errors != st0.Errors {
			t.Errorf("Stats() = %+v (before: %+v), want no error, none expired", st, st0)
		}
	}
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		proxy, s := behindProxy(t, srv, Options{Timeout: timeout})
		check(t, s, []*redistest.FaultProxy{proxy}, everyAlgorithm("d/k=redial", 1))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartProxiedCluster(t, 3)
		s := newStore(t, Options{ClusterSeeds: c.Seeds(), Timeout: timeout})
		var items []engine.Item
		for _, d := range descsOnDistinctMasters(t, c, s, oneHit("x")[0].Rule, 3) {
			items = append(items, everyAlgorithm(d, 1)...)
		}
		check(t, s, c.Proxies, items)
	})
}

// TestNoConnectionUnderLoad: 64 concurrent callers of 20 calls each on a
// warmed store open no connection for their pipelines: every worker sends
// on the connection Warm set up. go-redis's pipeline pool grew under load,
// dialing inside the calls that found it empty.
func TestNoConnectionUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL()})
	warmed := s.links.setups.Load()
	if warmed != uint64(s.opts.Workers) {
		t.Fatalf("Warm set up %d connections, want one per worker (%d)", warmed, s.opts.Workers)
	}
	errs := make(chan error, 64*20)
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for i := range 20 {
				_, err := s.Apply(context.Background(), oneHit(fmt.Sprintf("d/k=%d-%d", g, i)), make([]engine.Result, 1))
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a call under load: %v", err)
		}
	}
	if n := s.links.setups.Load(); n != warmed {
		t.Errorf("%d connections set up under load after Warm's %d, want none", n-warmed, warmed)
	}
}
