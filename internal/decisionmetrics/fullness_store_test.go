package decisionmetrics

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/service"
)

const fullnessConfig = `
domain: fill
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 1000} # never half full here: no series
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket}
  - key: tenant
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: leased
    lease: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
`

// TestFullness: the fullness of each limit's keys through the service,
// the same on both stores.
func TestFullness(t *testing.T) { onBothStores(t, testFullness) }

// A key blocked by a penalty counts as full until its block ends, past its
// window.
func TestFullnessPenalty(t *testing.T) { onBothStores(t, testFullnessPenalty) }

// onBothStores runs test on a memory store and on a Redis store, each on a
// test clock of its own.
func onBothStores(t *testing.T, test func(*testing.T, engine.Store, *storetest.Clock)) {
	t.Run("memory", func(t *testing.T) {
		clock := storetest.NewClock(storetest.T0)
		ms := memstore.New(memstore.Options{Now: clock.Now})
		t.Cleanup(func() { ms.Close() })
		test(t, ms, clock)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		clock := storetest.NewClock(storetest.T0)
		rs, err := redisstore.New(redisstore.Options{URL: srv.URL(), Now: clock.Now, Prefix: "fullness:"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		test(t, rs, clock)
	})
}

func testFullnessPenalty(t *testing.T, store engine.Store, clock *storetest.Clock) {
	reg := prometheus.NewPedanticRegistry()
	svc, _ := observed(reg, service.Options{Store: store, Now: clock.Now}, Options{Now: clock.Now})
	cfg, err := config.Parse("login.yaml", []byte(`
domain: login
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2, penalty: [5m]}
`))
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(cfg)
	ask := func() service.Code {
		t.Helper()
		resp, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "login", Descriptors: []service.Descriptor{desc("remote_address", "192.0.2.1")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Code
	}
	for i, st := range []struct {
		name string
		at   time.Duration
		want service.Code // of a request then; 0 for none
		full []string
	}{
		{"the first of 2", 0, service.OK, series3("login/remote_address/1m", 1, 0, 0)},
		{"the second", 0, service.OK, series3("login/remote_address/1m", 1, 1, 1)},
		{"a third: denied, a strike, blocked for 5 minutes", time.Second, service.OverLimit, series3("login/remote_address/1m", 1, 1, 1)},
		{"+1m: the window has reset, the block holds", time.Minute, 0, series3("login/remote_address/1m", 1, 1, 1)},
		{"+5m1s: the block is over", 5*time.Minute + time.Second, 0, series3("login/remote_address/1m", 0, 0, 0)},
	} {
		clock.Set(storetest.T0.Add(st.at))
		if st.want != 0 {
			if got := ask(); got != st.want {
				t.Fatalf("step %d (%s): %v, want %v", i, st.name, got, st.want)
			}
		}
		if got := fullnessSeries(t, reg); !slices.Equal(got, st.full) {
			t.Errorf("step %d (%s): rls_limit_keys_fullness\n got %v\nwant %v", i, st.name, got, st.full)
		}
	}
}

func testFullness(t *testing.T, store engine.Store, clock *storetest.Clock) {
	reg := prometheus.NewPedanticRegistry()
	svc, m := observed(reg, service.Options{Store: store, Now: clock.Now}, Options{Now: clock.Now})
	load := func(yaml string) {
		t.Helper()
		cfg, err := config.Parse("fill.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		svc.SetConfig(cfg)
	}
	load(fullnessConfig)
	config20 := strings.Replace(fullnessConfig, "requests_per_unit: 10}", "requests_per_unit: 20}", 1)
	ask := func(times int, d service.Descriptor) {
		t.Helper()
		for range times {
			if _, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "fill", Descriptors: []service.Descriptor{d}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	refund := func(hits uint64, kv ...string) service.Descriptor {
		d := desc(kv...)
		d.HasHits, d.Hits, d.Refund = true, hits, true
		return d
	}
	override := func(kv ...string) service.Descriptor {
		d := desc(kv...)
		d.Override = &service.Override{RequestsPerUnit: 4, Unit: engine.Minute}
		return d
	}
	steps := []struct {
		name string
		do   func()
		want []string
	}{
		{"keys below half full: no series", func() {
			ask(4, desc("user", "d"))
			ask(1, desc("closed", "x"))
		}, nil},
		{"a key at 50 %, one at 80 %, one at 100 % and denied", func() {
			ask(5, desc("user", "a"))
			ask(8, desc("user", "b"))
			ask(11, desc("user", "c"))
		}, series3("fill/user/1m", 3, 2, 1)},
		{"a shadow-mode limit over (not denied), a leased limit spent (not sampled)", func() {
			ask(3, desc("tenant", "t"))
			ask(2, desc("leased", "l"))
		}, want(series3("fill/user/1m", 3, 2, 1), series3("fill/tenant/1m", 1, 1, 1))},
		{"a token bucket at 90 %, a request override spent", func() {
			ask(9, desc("bucket", "k"))
			ask(4, override("user", "o"))
		}, want(series3("fill/user/1m", 3, 2, 1), series3("fill/tenant/1m", 1, 1, 1), series3("fill/bucket/1m", 1, 1, 0), series3("fill/override", 1, 1, 1))},
		{"6 hits given back to c (40 %): out; b at 100 %", func() {
			ask(1, refund(6, "user", "c"))
			ask(2, desc("user", "b"))
		}, want(series3("fill/user/1m", 2, 1, 1), series3("fill/tenant/1m", 1, 1, 1), series3("fill/bucket/1m", 1, 1, 0), series3("fill/override", 1, 1, 1))},
		{"+36s: the bucket has refilled 6 (one every 6s): 40 % spent after one more, out; the windows hold", func() {
			clock.Set(storetest.T0.Add(36 * time.Second))
			ask(1, desc("bucket", "k"))
		}, want(series3("fill/user/1m", 2, 1, 1), series3("fill/tenant/1m", 1, 1, 1), series3("fill/bucket/1m", 0, 0, 0), series3("fill/override", 1, 1, 1))},
		{"a reload: the user limit of 10/min is now 20/min (its sample goes), the rest is kept", func() {
			load(config20)
		}, want(series3("fill/tenant/1m", 1, 1, 1), series3("fill/bucket/1m", 0, 0, 0), series3("fill/override", 1, 1, 1))},
		{"b again: 11 of 20", func() {
			ask(1, desc("user", "b"))
		}, want(series3("fill/user/1m", 1, 0, 0), series3("fill/tenant/1m", 1, 1, 1), series3("fill/bucket/1m", 0, 0, 0), series3("fill/override", 1, 1, 1))},
		{"a reset of user=b: out", func() {
			if _, err := svc.Reset(context.Background(), &service.Request{Domain: "fill", Descriptors: []service.Descriptor{desc("user", "b")}}); err != nil {
				t.Fatal(err)
			}
		}, want(series3("fill/user/1m", 0, 0, 0), series3("fill/tenant/1m", 1, 1, 1), series3("fill/bucket/1m", 0, 0, 0), series3("fill/override", 1, 1, 1))},
		{"+60s: every window has reset", func() {
			clock.Set(storetest.T0.Add(time.Minute))
		}, want(series3("fill/user/1m", 0, 0, 0), series3("fill/tenant/1m", 0, 0, 0), series3("fill/bucket/1m", 0, 0, 0), series3("fill/override", 0, 0, 0))},
		{"a reload without the tenant limit: its series go", func() {
			load(strings.Replace(config20, "key: tenant", "key: renamed", 1))
		}, want(series3("fill/user/1m", 0, 0, 0), series3("fill/bucket/1m", 0, 0, 0), series3("fill/override", 0, 0, 0))},
	}
	for i, st := range steps {
		st.do()
		if got := fullnessSeries(t, reg); !slices.Equal(got, st.want) {
			t.Errorf("step %d (%s): rls_limit_keys_fullness\n got %v\nwant %v", i, st.name, got, st.want)
		}
	}
	if n := testutil.ToFloat64(m.full.dropped); n != 0 {
		t.Errorf("rls_limit_keys_fullness_dropped_total = %v, want 0", n)
	}
	if got := m.full.size.Load(); got != 0 {
		t.Errorf("entries in all samples: %d, want 0 (every window reset)", got)
	}
}

// The bounds reach the service: a limit's sample keeps at most
// FullnessKeysPerLimit keys, and counts what it could not keep.
func TestFullnessBoundsThroughService(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	ms := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(func() { ms.Close() })
	reg := prometheus.NewPedanticRegistry()
	svc, m := observed(reg, service.Options{Store: ms, Now: clock.Now}, Options{Now: clock.Now, FullnessKeysPerLimit: 3})
	cfg, err := config.Parse("fill.yaml", []byte(fullnessConfig))
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(cfg)
	for i := range 5 {
		for range 10 {
			if _, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "fill", Descriptors: []service.Descriptor{desc("user", fmt.Sprint(i))}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, want := fullnessSeries(t, reg), series3("fill/user/1m", 3, 3, 3); !slices.Equal(got, want) {
		t.Errorf("5 keys full, 3 kept: %v, want %v", got, want)
	}
	// Keys 3 and 4 each: 5 decisions at 50 % to 90 % found no place among
	// full keys, and the 10th displaced one of them.
	if n := testutil.ToFloat64(m.full.dropped); n != 12 {
		t.Errorf("rls_limit_keys_fullness_dropped_total = %v, want 12", n)
	}
}

// BenchmarkShouldRateLimitFull is BenchmarkShouldRateLimit on a key that
// stays full (every request denied): the sample's entry updated in place on
// each decision.
func BenchmarkShouldRateLimitFull(b *testing.B) {
	benchDecisions(b, service.Options{}, 1)
}

// Decisions, scrapes and reloads at once (run with -race): afterwards the
// count of all entries is that of the current config's samples, within the
// bounds.
func TestFullnessConcurrent(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { ms.Close() })
	reg := prometheus.NewPedanticRegistry()
	svc, m := observed(reg, service.Options{Store: ms}, Options{FullnessKeysPerLimit: 20, FullnessKeys: 50})
	var configs []*config.Config
	for _, y := range []string{fullnessConfig, strings.Replace(fullnessConfig, "requests_per_unit: 10}", "requests_per_unit: 20}", 1)} {
		cfg, err := config.Parse("fill.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		configs = append(configs, cfg)
	}
	svc.SetConfig(configs[0])
	var deciders sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 3 {
		deciders.Go(func() {
			for i := range 3000 {
				d := desc([]string{"user", "bucket", "tenant"}[i%3], fmt.Sprint(g, "-", i%97))
				if i%11 == 0 {
					d.HasHits, d.Hits, d.Refund = true, 3, true
				}
				if _, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "fill", Descriptors: []service.Descriptor{d}}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Reloads and scrapes until the decisions are done.
	stop, reloads := make(chan struct{}), make(chan int)
	go func() {
		i := 0
		defer func() { reloads <- i }()
		for ; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			svc.SetConfig(configs[i%2])
			if _, err := reg.Gather(); err != nil {
				errs <- err
				return
			}
		}
	}()
	deciders.Wait()
	close(stop)
	t.Logf("%d reloads and scrapes during the decisions", <-reloads)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	f := m.full
	f.mu.Lock()
	defer f.mu.Unlock()
	total := 0
	for id, ks := range f.samples {
		ks.mu.Lock()
		if len(ks.entries) > f.perLimit || len(ks.index) != len(ks.entries) {
			t.Errorf("sample %v: %d entries, %d indexed, bound %d", id, len(ks.entries), len(ks.index), f.perLimit)
		}
		total += len(ks.entries)
		ks.mu.Unlock()
	}
	if got := f.size.Load(); got != int64(total) || got > f.total {
		t.Errorf("size %d, entries of the current samples %d, bound %d", got, total, f.total)
	}
}
