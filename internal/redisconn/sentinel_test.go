package redisconn

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
)

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
		s := newStore(t, Options{URL: tc.url, Sentinel: sen, Timeout: time.Second})
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.Warm(pctx)
		cancel()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Warm = %v, want success %v", tc.name, err, tc.ok)
		}
	}
}

// TestSentinelFailover: the master is killed. Requests fail meanwhile,
// then succeed on the master Sentinel promotes, with the same store (no
// restart); what the old master had replicated still counts, the function
// library is loaded on the new master when it lacks it, the store follows
// the new master (its clock read again, the denial cache emptied and its
// subscription moved there, where released hits are announced).
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
	if got := a.master.current(); got != promoted.Addr() {
		t.Errorf("the store follows %s, want the promoted master %s", got, promoted.Addr())
	}
	if !strings.Contains(logs.String(), "Sentinel names another master") || !strings.Contains(logs.String(), "to="+promoted.Addr()) {
		t.Errorf("the log does not say the master changed to %s:\n%s", promoted.Addr(), logs.String())
	}
	if lib, err := promoted.Do("FUNCTION", "LIST"); err != nil || !strings.Contains(lib, "rls_") {
		t.Errorf("FUNCTION LIST on the new master: %q, %v; want the rls library loaded", lib, err)
	}
	if !a.clock.known("") {
		t.Error("the store knows no clock of the new master after a request")
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

// TestMasterChangeForgetsWhatHeldForTheOldOne: when the store follows
// another master than the one before, it forgets that node's clock (a TIME
// is read before the next request) and empties the denial cache. The first
// master known changes nothing.
func TestMasterChangeForgetsWhatHeldForTheOldOne(t *testing.T) {
	// No sentinel answers: the store never subscribes, which this test
	// does not need.
	s, err := New(Options{Sentinel: &Sentinel{Master: "m", Addrs: []string{servetest.Addr(t)}}, DenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	now := time.Now()
	s.clock.sample("", now.UnixMicro(), now, now)
	put := func() {
		s.cache.mu.Lock()
		s.cache.m["rls:{d/k=v}:fw60s"] = denial{}
		s.cache.mu.Unlock()
	}
	cachedEntries := func() int {
		s.cache.mu.Lock()
		defer s.cache.mu.Unlock()
		return len(s.cache.m)
	}
	put()
	s.master.switchTo("127.0.0.1:7001")
	s.master.switchTo("127.0.0.1:7001")
	if !s.clock.known("") || cachedEntries() != 1 {
		t.Fatalf("after the first master is known: clock known %v, %d cached; want known, 1", s.clock.known(""), cachedEntries())
	}
	moved := s.master.next()
	s.master.switchTo("127.0.0.1:7002")
	if s.clock.known("") || cachedEntries() != 0 || moved.Err() == nil {
		t.Errorf("after a switch to another node: clock known %v, %d cached, subscription told %v; want forgotten, 0, told",
			s.clock.known(""), cachedEntries(), moved.Err())
	}
}

// TestSentinelTLS: sentinels and data nodes over TLS only. The store
// verifies each under the address it is reached at (the certificates name
// 127.0.0.1), not the URL's host, which Sentinel mode ignores; a CA that
// signed nothing there is refused.
func TestSentinelTLS(t *testing.T) {
	pki := testpki.New(t)
	st := redistest.StartSentinel(t, redistest.SentinelConfig{TLS: pki, Password: "data-secret"})
	items := []engine.Item{{Desc: "d/k=tls", Rule: storetest.Rule(engine.FixedWindow, 5, time.Hour, 0), Hits: 1}}
	res := make([]engine.Result, 1)
	s := newStore(t, Options{URL: "rediss://:data-secret@redis.example/0", CAFile: pki.CA, Sentinel: sentinelOf(st), Timeout: time.Second})
	if ok, err := s.Apply(context.Background(), items, res); err != nil || !ok || res[0].Remaining != 4 {
		t.Fatalf("over TLS through Sentinel: %v %v %+v", ok, err, res[0])
	}
	untrusted := newStore(t, Options{URL: "rediss://:data-secret@redis.example/0", CAFile: pki.OtherCA, Sentinel: sentinelOf(st), Timeout: time.Second})
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

// TestSentinelFailoverLosesNoCounts: a failover asked of the sentinels
// (SENTINEL FAILOVER) while requests run, the old master alive throughout:
// every hit admitted is counted on the new master. Hits that went to the
// old master after its replica was promoted would be lost (the old master
// is made a replica of the new one and drops them); the store stops
// writing when a sentinel announces that it promotes the replica and
// writes again on the new master when one announces the switch.
func TestSentinelFailoverLosesNoCounts(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{DownAfter: 5 * time.Second})
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{Sentinel: sentinelOf(st), Now: clock.Now, Timeout: time.Second})
	const limit = 1_000_000
	items := []engine.Item{{Desc: "d/k=failover", Rule: storetest.Rule(engine.FixedWindow, limit, time.Hour, 0), Hits: 1}}
	var admitted, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			res := make([]engine.Result, 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				ok, err := s.Apply(ctx, items, res)
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
					time.Sleep(time.Millisecond) // no busy loop while there is no master
				case ok:
					admitted.Add(1)
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	waitCount := func(what string, c *atomic.Int64, n int64) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); c.Load() < n; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d within 30 s, want %d", what, c.Load(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitCount("requests admitted before the failover", &admitted, 200)
	old := st.Master()
	if _, err := st.Sentinels[0].Do("SENTINEL", "FAILOVER", st.Name); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	promoted := st.WaitFailover(old)
	t.Logf("sentinels agree on %s %s after the failover was asked; admitted %d", promoted.Addr(), time.Since(asked), admitted.Load())
	for deadline := time.Now().Add(30 * time.Second); s.master.current() != promoted.Addr(); {
		if time.Now().After(deadline) {
			t.Fatalf("the store follows %s 30 s after the failover, want %s", s.master.current(), promoted.Addr())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the store follows it %s after the failover was asked; admitted %d", time.Since(asked), admitted.Load())
	waitCount("requests admitted after the failover", &admitted, admitted.Load()+200)
	close(stop)
	wg.Wait()
	stop = make(chan struct{})

	// What the new master counted, as another process reads it.
	look := []engine.Item{{Desc: items[0].Desc, Rule: items[0].Rule}}
	res := make([]engine.Result, 1)
	other := newStore(t, Options{Sentinel: sentinelOf(st), Now: clock.Now, Timeout: time.Second})
	if _, err := other.Apply(context.Background(), look, res); err != nil {
		t.Fatal(err)
	}
	counted := int64(limit - res[0].Remaining)
	t.Logf("admitted %d, counted on the new master %d (lost %d), %d requests failed", admitted.Load(), counted, admitted.Load()-counted, failed.Load())
	if counted != admitted.Load() {
		t.Errorf("admitted %d hits across the failover, the new master counts %d: %d lost", admitted.Load(), counted, admitted.Load()-counted)
	}
}

// TestSentinelRefusesAReplica: told that the master is a node that is a
// replica (a sentinel's stale answer), here one that takes writes
// (replica-read-only no), the store refuses its connections, sending
// nothing, asks the sentinels again and decides on the master they name:
// every hit admitted is counted there.
func TestSentinelRefusesAReplica(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{DownAfter: 5 * time.Second})
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{Sentinel: sentinelOf(st), Now: clock.Now, Timeout: time.Second})
	items := []engine.Item{{Desc: "d/k=replica", Rule: storetest.Rule(engine.FixedWindow, 100, time.Hour, 0), Hits: 1}}
	res := make([]engine.Result, 1)
	ctx := context.Background()
	if ok, err := s.Apply(ctx, items, res); err != nil || !ok {
		t.Fatalf("first request: %v %v", ok, err)
	}
	master := st.Master()
	replica := st.Nodes[0]
	if replica == master {
		replica = st.Nodes[1]
	}
	if _, err := replica.Do("CONFIG", "SET", "replica-read-only", "no"); err != nil {
		t.Fatal(err)
	}
	s.master.switchTo(replica.Addr())
	ok, err := s.Apply(ctx, items, res)
	if err == nil || !strings.Contains(err.Error(), "not the master") {
		t.Fatalf("a request with the replica named: %v %v, want an error saying it is not the master", ok, err)
	}
	admitted := 1
	for deadline := time.Now().Add(10 * time.Second); ; {
		ok, err := s.Apply(ctx, items, res)
		if err == nil && ok {
			admitted++
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request decided within 10 s of the replica's refusal: %v %v", ok, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.master.current(); got != master.Addr() {
		t.Errorf("the store follows %s, want the master %s", got, master.Addr())
	}
	if res[0].Remaining != uint64(100-admitted) {
		t.Errorf("remaining %d after %d hits admitted, want %d: a hit went elsewhere", res[0].Remaining, admitted, 100-admitted)
	}
	if st := s.Stats(); st.Indeterminate != 0 {
		t.Errorf("Stats() = %+v, want nothing indeterminate", st)
	}
}
