package redisconn

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
)

func sentinelOf(st *redistest.Sentinel) *Sentinel {
	return &Sentinel{Master: st.Name, Addrs: st.Addrs()}
}

// TestSentinelPasswords: the master's password comes from the URL, the
// sentinels' from Sentinel; a wrong one of either fails.
func TestSentinelPasswords(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{Password: "data-secret", SentinelPassword: "sentinel-secret"})
	ctx := context.Background()
	for _, tc := range []struct {
		name, url, sentinelPassword string
		ok                          bool
	}{
		{"both right", "redis://:data-secret@ignored/0", "sentinel-secret", true},
		{"the master's wrong", "redis://:wrong@ignored/0", "sentinel-secret", false},
		{"the sentinels' wrong", "redis://:data-secret@ignored/0", "wrong", false},
	} {
		sen := sentinelOf(st)
		sen.Password = tc.sentinelPassword
		c := newConn(t, Options{URL: tc.url, Sentinel: sen, Timeout: time.Second})
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.Warm(pctx)
		cancel()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Warm = %v, want success %v", tc.name, err, tc.ok)
		}
	}
}

// TestMasterChangeForgetsTheOldOnesClock: when the Conn follows another
// master than the one before, it forgets that node's clock (a TIME is read
// before the next request), tells its caller (OnMasterChange) and cancels
// what waited for the next change (OnMasterMove). The first master known
// changes nothing.
func TestMasterChangeForgetsTheOldOnesClock(t *testing.T) {
	// No sentinel answers: the Conn never subscribes, which this test does
	// not need.
	var changes atomic.Int64
	c, err := New(Options{Sentinel: &Sentinel{Master: "m", Addrs: []string{servetest.Addr(t)}},
		OnMasterChange: func(from, to string) { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	now := time.Now()
	c.clock.sample("", now.UnixMicro(), now, now)
	moved := make(chan struct{})
	c.OnMasterMove(func() { close(moved) })
	c.master.switchTo("127.0.0.1:7001")
	c.master.switchTo("127.0.0.1:7001")
	if !c.clock.known("") || changes.Load() != 0 {
		t.Fatalf("after the first master is known: clock known %v, %d changes told; want known, none", c.clock.known(""), changes.Load())
	}
	c.master.switchTo("127.0.0.1:7002")
	if c.clock.known("") || changes.Load() != 1 {
		t.Errorf("after a switch to another node: clock known %v, %d changes told; want forgotten, 1", c.clock.known(""), changes.Load())
	}
	select {
	case <-moved:
	case <-time.After(10 * time.Second):
		t.Error("OnMasterMove's function did not run within 10 s of the switch")
	}
}

// TestSentinelTLS: sentinels and data nodes over TLS only. The Conn
// verifies each under the address it is reached at (the certificates name
// 127.0.0.1), not the URL's host, which Sentinel mode ignores; a CA that
// signed nothing there is refused.
func TestSentinelTLS(t *testing.T) {
	pki := testpki.New(t)
	st := redistest.StartSentinel(t, redistest.SentinelConfig{TLS: pki, Password: "data-secret"})
	c := newConn(t, Options{URL: "rediss://:data-secret@redis.example/0", CAFile: pki.CA, Sentinel: sentinelOf(st), Timeout: time.Second})
	if n, err := c.bounded("tls", 1); err != nil || n != 1 {
		t.Fatalf("over TLS through Sentinel: %d %v", n, err)
	}
	untrusted := newConn(t, Options{URL: "rediss://:data-secret@redis.example/0", CAFile: pki.OtherCA, Sentinel: sentinelOf(st), Timeout: time.Second})
	pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := untrusted.Ping(pctx); err == nil {
		t.Error("Ping with a CA that signed nothing there succeeded")
	}
}

// Bad Sentinel options are refused by New, with the value.
func TestSentinelOptionsRefused(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Sentinel: &Sentinel{Addrs: []string{"127.0.0.1:26379"}}}, "a master name and at least one sentinel"},
		{Options{Sentinel: &Sentinel{Master: "m"}}, "a master name and at least one sentinel"},
		{Options{Sentinel: &Sentinel{Master: "m", Addrs: []string{"nohost"}}}, `redis sentinel address "nohost"`},
		{Options{Sentinel: &Sentinel{Master: "m", Addrs: []string{"127.0.0.1:26379"}}, ClusterSeeds: []string{"127.0.0.1:7000"}}, "Sentinel and cluster seeds"},
	} {
		c, err := New(tc.opts)
		if err == nil {
			c.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.opts, err, tc.want)
		}
	}
}

// TestSentinelFailoverLosesNoCounts: a failover asked of the sentinels
// (SENTINEL FAILOVER) while requests run, the old master alive throughout:
// every request that ran is counted on the new master. Hits that went to
// the old master after its replica was promoted would be lost (the old
// master is made a replica of the new one and drops them); the Conn stops
// writing when a sentinel announces that it promotes the replica and
// writes again on the new master when one announces the switch, whose
// clock it reads anew.
func TestSentinelFailoverLosesNoCounts(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{DownAfter: 5 * time.Second})
	c := newConn(t, Options{Sentinel: sentinelOf(st), Timeout: time.Second})
	var ran, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := c.run(ctx, "failover", 1)
				cancel()
				if err != nil {
					failed.Add(1)
					time.Sleep(time.Millisecond) // no busy loop while there is no master
					continue
				}
				ran.Add(1)
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	waitCount := func(what string, n int64) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ran.Load() < n; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d within 30 s, want %d", what, ran.Load(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitCount("requests run before the failover", 200)
	old := st.Master()
	if _, err := st.Sentinels[0].Do("SENTINEL", "FAILOVER", st.Name); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	promoted := st.WaitFailover(old)
	t.Logf("sentinels agree on %s %s after the failover was asked; ran %d", promoted.Addr(), time.Since(asked), ran.Load())
	for deadline := time.Now().Add(30 * time.Second); c.master.current() != promoted.Addr(); {
		if time.Now().After(deadline) {
			t.Fatalf("the Conn follows %s 30 s after the failover, want %s", c.master.current(), promoted.Addr())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the Conn follows it %s after the failover was asked; ran %d", time.Since(asked), ran.Load())
	waitCount("requests run after the failover", ran.Load()+200)
	close(stop)
	wg.Wait()
	stop = make(chan struct{})

	if !c.clock.known("") {
		t.Error("the Conn knows no clock of the new master after its requests")
	}
	counted, err := promoted.Do("GET", "failover")
	t.Logf("ran %d, counted on the new master %s, %d requests failed", ran.Load(), counted, failed.Load())
	if err != nil || counted != strconv.FormatInt(ran.Load(), 10) {
		t.Errorf("ran %d requests across the failover, the new master counts %q (%v)", ran.Load(), counted, err)
	}
	if n := c.out.indeterminate.Load(); n != 0 {
		t.Errorf("%d indeterminate, want none", n)
	}
}

// TestSentinelRefusesAReplica: told that the master is a node that is a
// replica (a sentinel's stale answer), here one that takes writes
// (replica-read-only no), the Conn refuses its connections, sending
// nothing, asks the sentinels again and runs on the master they name:
// every request that ran is counted there.
func TestSentinelRefusesAReplica(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{DownAfter: 5 * time.Second})
	c := newConn(t, Options{Sentinel: sentinelOf(st), Timeout: time.Second})
	ctx := context.Background()
	if _, err := c.run(ctx, "replica", 1); err != nil {
		t.Fatalf("first request: %v", err)
	}
	master := st.Master()
	replica := st.Nodes[0]
	if replica == master {
		replica = st.Nodes[1]
	}
	if _, err := replica.Do("CONFIG", "SET", "replica-read-only", "no"); err != nil {
		t.Fatal(err)
	}
	c.master.switchTo(replica.Addr())
	if n, err := c.run(ctx, "replica", 1); err == nil || !strings.Contains(err.Error(), "not the master") {
		t.Fatalf("a request with the replica named: %d %v, want an error saying it is not the master", n, err)
	}
	ran := int64(1)
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, err := c.run(ctx, "replica", 1)
		if err == nil {
			ran++
			if n != ran {
				t.Errorf("the master counts %d after %d requests ran, want %d: a request went elsewhere", n, ran, ran)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request ran within 10 s of the replica's refusal: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := c.master.current(); got != master.Addr() {
		t.Errorf("the Conn follows %s, want the master %s", got, master.Addr())
	}
	if n := c.out.indeterminate.Load(); n != 0 {
		t.Errorf("%d indeterminate, want none", n)
	}
}
