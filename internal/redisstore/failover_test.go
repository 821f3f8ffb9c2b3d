package redisstore

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
)

// The store on the master that Sentinel names: conformance, late replies
// given back, and what a failover changes for the store (its denial cache
// and the subscription it follows). How the driver follows the master is
// tested in redisconn.

func sentinelOf(st *redistest.Sentinel) *Sentinel {
	return &Sentinel{Master: st.Name, Addrs: st.Addrs()}
}

// TestSentinel: a store on the master that Sentinel names passes the
// conformance suite, and gives late replies back, as on a single node. The
// data nodes are reached through proxies that the sentinels know them by;
// the sentinels wait 5 s before taking a slow master for down, longer than
// the late replies' delays.
func TestSentinel(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{Proxied: true, DownAfter: 5 * time.Second})
	t.Run("conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
			return newStore(t, Options{Sentinel: sentinelOf(st), Now: now})
		})
	})
	t.Run("late replies given back", func(t *testing.T) {
		s := newStore(t, Options{Sentinel: sentinelOf(st), Prefix: "late:", Timeout: lateTimeout, minPipelineBound: starvedBound})
		checkLateRepliesGivenBack(t, st.Proxy(st.Master()), s, 3, false)
	})
}

// TestSentinelFailover: the master is killed. Requests fail meanwhile,
// then succeed on the master Sentinel promotes, with the same store (no
// restart); what the old master had replicated still counts, the function
// library is loaded on the new master when it lacks it, the store follows
// the new master (the denial cache emptied and its subscription moved
// there, where released hits are announced).
func TestSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{DownAfter: 2 * time.Second})
	var logs servetest.SyncBuffer
	opts := Options{Sentinel: sentinelOf(st), Timeout: 200 * time.Millisecond, minPipelineBound: starvedBound,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	a := newStore(t, Options{Sentinel: opts.Sentinel, Timeout: opts.Timeout, minPipelineBound: starvedBound, Logger: opts.Logger, DenyCache: true})
	b := newStore(t, opts) // another rls process
	ctx := context.Background()
	hour := storetest.Rule(engine.FixedWindow, 100, time.Hour, 0)
	one := storetest.Rule(engine.FixedWindow, 1, time.Hour, 0)
	one.ID += ":3:one"
	counted := []engine.Item{{Desc: "d/k=counted", Rule: hour, Hits: 1}}
	cached := []engine.Item{{Desc: "d/k=cached", Rule: one, Hits: 1}}
	res := make([]engine.Result, 1)
	apply := func(s *Store, step string, items []engine.Item, want bool) {
		t.Helper()
		ok, err := s.Apply(ctx, items, res)
		if err != nil || ok != want {
			t.Fatalf("%s: Apply = %v, %v; want %v", step, ok, err, want)
		}
	}
	for i := range 10 {
		apply(a, "hit "+string(rune('0'+i))+" before the failover", counted, true)
	}
	apply(a, "the one hit of the cached limit", cached, true)
	apply(a, "denied", cached, false)
	apply(a, "denied again", cached, false)
	if !res[0].Cached {
		t.Fatal("the second denial was not answered from the denial cache")
	}
	old := st.Master()
	if n, err := old.Do("WAIT", "1", "5000"); err != nil || n != "1" {
		t.Fatalf("WAIT for the replica: %q, %v", n, err)
	}

	old.Kill()
	killed := time.Now()
	// Within the 2 s before the sentinels take the master for down,
	// requests fail: there is no master.
	for i := range 3 {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := a.Apply(callCtx, counted, res)
		late := callCtx.Err()
		cancel()
		if err == nil {
			t.Fatalf("request %d with the master dead: no error", i)
		}
		if late != nil {
			t.Errorf("request %d with the master dead: %v, answered only at the caller's 2 s deadline", i, err)
		}
	}
	promoted := st.WaitFailover(old)
	// A master without the function library (a node promoted before it
	// had it, FUNCTION FLUSH): the first call loads it.
	if _, err := promoted.Do("FUNCTION", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	// Requests that failed with the master dead may count as
	// indeterminate (the batcher cannot tell a failed dial from a lost
	// reply); from here on nothing may.
	st0 := a.Stats()
	failed := 0
	for deadline := time.Now().Add(30 * time.Second); ; failed++ {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ok, err := a.Apply(callCtx, counted, res)
		cancel()
		if err == nil {
			if !ok || res[0].Remaining != 100-11 {
				t.Fatalf("first request on the new master: %v %+v; want admitted with 89 remaining (10 hits replicated before the failover)", ok, res[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request succeeded within 30 s of the failover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("after the sentinels agreed on %s, %d requests failed before one succeeded, %s after the kill", promoted.Addr(), failed, time.Since(killed).Round(time.Millisecond))
	if !strings.Contains(logs.String(), "Sentinel names another master") || !strings.Contains(logs.String(), "to="+promoted.Addr()) {
		t.Errorf("the log does not say the master changed to %s:\n%s", promoted.Addr(), logs.String())
	}
	if lib, err := promoted.Do("FUNCTION", "LIST"); err != nil || !strings.Contains(lib, "rls_") {
		t.Errorf("FUNCTION LIST on the new master: %q, %v; want the rls library loaded", lib, err)
	}
	// The denial cache was emptied at the change: the next denial comes
	// from the new master, then from the cache once the subscription is
	// confirmed there.
	waitLive(t, a)
	apply(a, "denied by the new master", cached, false)
	if res[0].Cached {
		t.Error("a denial learnt from the old master was answered after the failover")
	}
	apply(a, "denied again", cached, false)
	if !res[0].Cached {
		t.Fatal("the second denial on the new master was not answered from the denial cache")
	}
	// Another process gives the hit back on the new master: the notice
	// reaches a through its new subscription.
	apply(b, "the hit given back", []engine.Item{{Desc: "d/k=cached", Rule: one, Hits: 1, Refund: true}}, true)
	waitCacheEmpty(t, a, "the refund on the new master was not announced to the store within 5 s")
	if stats := a.Stats(); stats.Indeterminate != st0.Indeterminate {
		t.Errorf("Stats() = %+v (at the failover: %+v), want no indeterminate outcome after it", stats, st0)
	}
}

// TestSentinelOptionsRefused: bad Sentinel options are refused by New, with
// the value, those of the per-second Redis named so (the driver's own
// checks: redisconn's TestSentinelOptionsRefused).
func TestSentinelOptionsRefused(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Sentinel: &Sentinel{Master: "m", Addrs: []string{"127.0.0.1:26379"}}, ClusterSeeds: []string{"127.0.0.1:7000"}}, "Sentinel and cluster seeds"},
		{Options{PerSecond: &Options{Sentinel: &Sentinel{Master: "m"}}}, "per-second Redis: redis sentinel"},
	} {
		s, err := New(tc.opts)
		if err == nil {
			s.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.opts, err, tc.want)
		}
	}
}
