package redisconn

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
)

// TestTLSFirstCallAfterReady: a Conn to Redis over TLS, warmed and ready
// (Ping), runs its first call within the default 10 ms timeout, at each of
// 12 cold starts. The pipelines took their connections from go-redis's
// pipeline pool, which Warm had not connected: the first call dialed and
// made its TLS handshake after its deadline in Redis's clock was set, and
// 4 of 12 cold starts failed with "no reply within the store timeout",
// once after /readyz said 200 (under the race detector, 12 of 12).
func TestTLSFirstCallAfterReady(t *testing.T) {
	files := testpki.New(t)
	srv := redistest.StartWith(t, redistest.Config{TLS: files})
	for i := range 12 {
		out := &outcomes{}
		c, err := New(Options{URL: "rediss://" + srv.Addr() + "/0", CAFile: files.CA, // the default timeout, 10 ms
			Library: stubLibrary, Function: stubRun, OnLate: out.onLate, OnIndeterminate: out.onIndeterminate})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.Warm(ctx); err != nil {
			t.Fatalf("cold start %d: Warm: %v", i, err)
		}
		if err := c.Ping(ctx); err != nil {
			t.Fatalf("cold start %d: Ping after Warm: %v", i, err)
		}
		cancel()
		tc := &testConn{c, out}
		if _, err := tc.bounded("first", 1); err != nil {
			t.Errorf("cold start %d: the first call after ready: %v", i, err)
		}
		// Every worker's connection was set up by Warm, and the call
		// set none up.
		if n := c.links.setups.Load(); n != uint64(c.opts.Workers) {
			t.Errorf("cold start %d: %d connections set up, want %d (one per worker, all by Warm)", i, n, c.opts.Workers)
		}
		c.Close()
	}
}

// refusedBound is how soon a call to a Redis that refuses connections
// must fail, with a timeout of 2 s: a tenth of it. go-redis dialed five
// times with 100 ms pauses inside each call, 0.41 s; a call now costs a
// look at the node's state (measured: see the README).
const refusedBound = 200 * time.Millisecond

// failsFast makes n calls on key to c and fails the test unless each fails
// within refusedBound; so must Ping.
func failsFast(t *testing.T, c *testConn, key string, n int, what string) {
	t.Helper()
	for i := range n {
		start := time.Now()
		_, err := c.run(context.Background(), key, 1)
		if d := time.Since(start); err == nil || d > refusedBound {
			t.Errorf("%s: call %d: %v after %s; want an error well before the 2 s timeout (within %s)", what, i, err, d, refusedBound)
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx); err == nil || time.Since(start) > refusedBound {
		t.Errorf("%s: Ping: %v after %s; want an error within %s", what, err, time.Since(start), refusedBound)
	}
}

// TestRefusedRedisFailsFast: with nothing listening at Redis's address
// from the start (connection refused) and a timeout of 2 s, every call and
// Ping fails well before the timeout, with nothing sent.
func TestRefusedRedisFailsFast(t *testing.T) {
	c := newConn(t, Options{URL: "redis://" + servetest.Addr(t) + "/0", Timeout: 2 * time.Second})
	failsFast(t, c, "refused", 20, "nothing listening")
	if st := c.Stats(); st.Scripts != 0 || c.out.indeterminate.Load() != 0 {
		t.Errorf("Stats() = %+v, %d indeterminate; want nothing sent", st, c.out.indeterminate.Load())
	}
}

// TestKilledRedisFailsFastAndComesBack: Redis killed mid-run (its port
// then refuses connections): every call fails well before the 2 s
// timeout, nothing is sent to it, and once Redis is restarted on its port
// the Conn reconnects by itself, with no call asking it to.
func TestKilledRedisFailsFastAndComesBack(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, Options{URL: srv.URL(), Timeout: 2 * time.Second})
	if _, err := c.bounded("killed", 1); err != nil {
		t.Fatalf("before the kill: %v", err)
	}
	scripts := c.Stats().Scripts
	srv.Kill()
	failsFast(t, c, "killed", 20, "Redis killed")
	if st := c.Stats(); st.Scripts != scripts || c.out.indeterminate.Load() != 0 {
		t.Errorf("Stats() = %+v (before the kill: %d scripts), %d indeterminate; want nothing sent to the killed Redis", st, scripts, c.out.indeterminate.Load())
	}
	srv.Restart()
	for deadline := time.Now().Add(10 * time.Second); c.links.downErr("") != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Redis restarted, no call: still down 10 s later: %v", c.links.downErr(""))
		}
	}
	waitRun(t, c, "killed", "after the restart")
}

// waitRun asks for a call on key until Redis runs it, for 10 s at most: the
// Conn reconnects in the background.
func waitRun(t *testing.T, c *testConn, key, what string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = c.Ping(ctx)
		cancel()
		if err != nil {
			continue
		}
		if _, err = c.bounded(key, 1); err == nil {
			return
		}
	}
	t.Fatalf("%s: not run within 10 s: %v", what, err)
}

// keysOnDistinctMasters returns n keys whose slots n different masters of
// cl serve.
func keysOnDistinctMasters(t *testing.T, cl *redistest.Cluster, n int) []string {
	t.Helper()
	var keys []string
	seen := map[*redistest.Server]bool{}
	for i := 0; len(keys) < n; i++ {
		if i == 1000 {
			t.Fatalf("no %d keys on distinct masters among 1000", n)
		}
		key := fmt.Sprintf("{k%d}", i)
		if m := cl.Master(cl.KeySlot(key)); !seen[m] {
			seen[m] = true
			keys = append(keys, key)
		}
	}
	return keys
}

// TestClusterKilledMasterFailsFast: a master of a cluster without replicas
// killed: calls to its slots fail well before the 2 s timeout, calls to
// the other masters run, and once the master is restarted (it rejoins with
// its slots) its calls run again without a new Conn.
func TestClusterKilledMasterFailsFast(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	c := newConn(t, Options{ClusterSeeds: cl.Seeds(), Timeout: 2 * time.Second})
	keys := keysOnDistinctMasters(t, cl, 2)
	victim, other := keys[0], keys[1]
	for _, k := range keys {
		if _, err := c.bounded(k, 1); err != nil {
			t.Fatalf("before the kill: %v", err)
		}
	}
	master := cl.Master(cl.KeySlot(victim))
	master.Kill()
	failsFast(t, c, victim, 20, "a master killed")
	for i := range 5 {
		if _, err := c.bounded(other, 1); err != nil {
			t.Errorf("call %d to a master still up: %v", i, err)
		}
	}
	master.Restart()
	cl.WaitHealthy()
	waitRun(t, c, victim, "after the master's restart")
}

// TestClusterMasterReplaced: a master of a cluster with replicas is
// killed and its replica takes over. Once the cluster no longer names the
// old master, the driver drops its links (links.retire); calls to its
// slots run on the new master; and Close returns with nothing left running
// (TestMain): the runners of the dropped links' flights end with them.
func TestClusterMasterReplaced(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 1)
	var logs servetest.SyncBuffer
	c := newConn(t, Options{ClusterSeeds: cl.Seeds(), Timeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	keys := keysOnDistinctMasters(t, cl, 3)
	for _, k := range keys {
		for range 4 { // pipelines on the links of the master's workers
			if _, err := c.bounded(k, 1); err != nil {
				t.Fatalf("before the kill: %v", err)
			}
		}
	}
	cl.Master(cl.KeySlot(keys[0])).Kill()
	// Calls to its slots, before the cluster elects the replica: they find
	// it down, and its prober starts.
	servetest.Eventually(t, "the log says the old master does not answer", func() bool {
		c.bounded(keys[0], 1)
		return strings.Contains(logs.String(), "a node does not answer")
	})
	waitRun(t, c, keys[0], "after the replica took over")
	servetest.Eventually(t, "the log says the old master was dropped", func() bool {
		return strings.Contains(logs.String(), "no longer a master of the cluster")
	})
	for _, k := range keys {
		if _, err := c.bounded(k, 1); err != nil {
			t.Errorf("after the old master was dropped, %s: %v", k, err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10 s of the old master's links being dropped")
	}
}

// TestNewConnectionNotChargedToTheCall: a call whose connection was reset
// mid-run needs a new one, whose setup takes 300 ms (a slow TLS handshake,
// a far server), three times the timeout: the call runs, as the connection
// is set up before its deadline is stamped. The pipelines dialed after it:
// the call reached Redis past its deadline, or its caller had stopped
// waiting. On a single node and in a cluster, with calls to three masters
// at once.
func TestNewConnectionNotChargedToTheCall(t *testing.T) {
	const timeout, hold = 100 * time.Millisecond, 300 * time.Millisecond
	check := func(t *testing.T, c *testConn, proxies []*redistest.FaultProxy, keys []string) {
		t.Helper()
		for _, k := range keys {
			if _, err := c.bounded(k, 0); err != nil {
				t.Fatalf("before the reset: %v", err)
			}
		}
		accepted := 0
		for _, p := range proxies {
			p.SetConnectDelay(hold)
			p.ResetConnections()
			accepted += p.Accepted()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		errs := make([]error, len(keys))
		var wg sync.WaitGroup
		for i, k := range keys {
			wg.Go(func() { _, errs[i] = c.run(ctx, k, 1) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("the call to %s after its connection was reset: %v", keys[i], err)
			}
		}
		after := 0
		for _, p := range proxies {
			after += p.Accepted()
			p.Heal()
		}
		if after == accepted {
			t.Error("no connection was made after the reset: the test did not exercise a new connection")
		}
	}
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		proxy := redistest.StartFaultProxy(t, srv.Addr())
		c := newConn(t, Options{URL: "redis://" + proxy.Addr() + "/0", Timeout: timeout})
		check(t, c, []*redistest.FaultProxy{proxy}, []string{"redial"})
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartProxiedCluster(t, 3)
		c := newConn(t, Options{ClusterSeeds: cl.Seeds(), Timeout: timeout})
		check(t, c, cl.Proxies, keysOnDistinctMasters(t, cl, 3))
	})
}

// TestNoConnectionUnderLoad: 64 concurrent callers of 20 calls each on a
// warmed Conn open no connection for their pipelines: every worker sends
// on the connection Warm set up. go-redis's pipeline pool grew under load,
// dialing inside the calls that found it empty.
func TestNoConnectionUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, Options{URL: srv.URL()})
	warmed := c.links.setups.Load()
	if warmed != uint64(c.opts.Workers) {
		t.Fatalf("Warm set up %d connections, want one per worker (%d)", warmed, c.opts.Workers)
	}
	errs := make(chan error, 64*20)
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for i := range 20 {
				_, err := c.bounded(fmt.Sprintf("load-%d-%d", g, i), 1)
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
	if n := c.links.setups.Load(); n != warmed {
		t.Errorf("%d connections set up under load after Warm's %d, want none", n-warmed, warmed)
	}
}
