package topkeys

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/service"
)

// zipfConfig has three limits of three algorithms, one per descriptor.
const zipfConfig = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 8}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 12, algorithm: token_bucket}
`

// sketchK is small beside the keys a trace denies, so that the sketches
// evict and their errors are not all 0.
const sketchK = 16

// t0 is the top of an hour: a trace within [t0, t0+1m) is in one window
// of every limit of zipfConfig.
var t0 = time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)

// clock is a test's virtual clock. Safe for concurrent use.
type clock struct{ us atomic.Int64 }

func (c *clock) set(t time.Time) { c.us.Store(t.UnixMicro()) }
func (c *clock) now() time.Time  { return time.UnixMicro(c.us.Load()).UTC() }

// truthObserver is the exact model of every limit's window: what each
// limit decided for each key. Safe for concurrent use.
type truthObserver struct {
	mu     sync.Mutex
	limits map[string]*truth // by label
}

func (o *truthObserver) ForConfig(*config.Config) any  { return nil }
func (o *truthObserver) Reloaded(error)                {}
func (o *truthObserver) Cleared(any, *service.Cleared) {}
func (o *truthObserver) Decided(_ any, d *service.Decision) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range d.Items {
		l := d.Limits[i]
		m := o.limits[l.Label]
		if m == nil {
			m = newTruth()
			o.limits[l.Label] = m
		}
		m.observe(d.Items[i].Desc, d.Results[i].Admitted, verdictOf(&d.Items[i], &d.Results[i]).fullness)
	}
}

func mustParse(t *testing.T, src string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// zipfTrace sends n requests of Zipf-distributed addresses and API keys
// to svcs in turn (from workers goroutines), moving clk along the first
// minute when move.
func zipfTrace(t *testing.T, seed uint64, svcs []*service.Service, clk *clock, n, workers int, move bool) {
	t.Helper()
	type req struct {
		ip, user, key uint64
		at            time.Time
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	ips := rand.NewZipf(rng, 1.2, 1, 20000)
	users := rand.NewZipf(rng, 1.1, 1, 50000)
	keys := rand.NewZipf(rng, 1.3, 1, 5000)
	reqs := make([]req, n)
	for i := range reqs {
		reqs[i] = req{ip: ips.Uint64(), user: users.Uint64(), key: keys.Uint64(), at: t0.Add(time.Duration(i) * 50 * time.Second / time.Duration(n))}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				r := reqs[i]
				if move {
					clk.set(r.at) // one worker when the clock moves
				}
				_, err := svcs[i%len(svcs)].ShouldRateLimit(context.Background(), &service.Request{Domain: "api", Descriptors: []service.Descriptor{
					{Entries: []config.Entry{{Key: "remote_address", Value: fmt.Sprintf("10.0.%d.%d", r.ip/256, r.ip%256)}}},
					{Entries: []config.Entry{{Key: "user", Value: fmt.Sprintf("u%d", r.user)}}},
					{Entries: []config.Entry{{Key: "api_key", Value: fmt.Sprintf("key-%d", r.key)}}},
				}})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// checkTop holds Top's answer for every limit to the truth, within the
// error it states: by denied, each key's true denials are in
// [Denied−Error, Denied], the limit's Error is at most D/K, every key
// denied more than the true 11th plus Error is listed, and every listed
// key is denied at least the true 10th less Error; by fullness (for the
// limits whose fullness only grows in the window, monotone), the listed
// fullnesses are the true 10 highest (of those at least MinFullness).
func checkTop(t *testing.T, seed uint64, k *Keys, tr *truthObserver, procs int, monotone map[string]bool) {
	t.Helper()
	ctx := context.Background()
	byDenied, err := k.Top(ctx, Query{Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	if byDenied.Processes != procs || byDenied.Note != "" {
		t.Fatalf("seed %d: Top merged %d processes (note %q), want %d", seed, byDenied.Processes, byDenied.Note, procs)
	}
	if len(byDenied.Limits) != 3 {
		t.Fatalf("seed %d: Top gave %d limits, want 3", seed, len(byDenied.Limits))
	}
	for _, lt := range byDenied.Limits {
		m := tr.limits[lt.Name]
		if lt.Denials != m.denials {
			t.Errorf("seed %d: %s: %d denials in the window, the truth %d", seed, lt.Name, lt.Denials, m.denials)
		}
		if bound := m.denials / uint64(k.K()); lt.Error > bound {
			t.Errorf("seed %d: %s: error %d, more than D/K = %d", seed, lt.Name, lt.Error, bound)
		}
		type kv struct {
			id string
			n  uint64
		}
		var all []kv
		for id, n := range m.denied {
			all = append(all, kv{id, n})
		}
		slices.SortFunc(all, func(a, b kv) int { return int(b.n) - int(a.n) })
		if len(all) < 11 {
			t.Fatalf("seed %d: %s: %d keys denied: the trace is too small to test a top 10", seed, lt.Name, len(all))
		}
		v10, v11 := all[9].n, all[10].n
		listed := map[string]bool{}
		exact := 0
		for i, key := range lt.Keys {
			true_ := m.denied[key.ID]
			if key.Denied < true_ || key.Denied-key.Error > true_ || key.Error > lt.Error {
				t.Errorf("seed %d: %s: key %s: denied %d error %d, true %d (limit error %d)", seed, lt.Name, key.ID, key.Denied, key.Error, true_, lt.Error)
			}
			if true_+lt.Error < v10 {
				t.Errorf("seed %d: %s: key %s listed %d with %d true denials, the true 10th has %d (error %d)", seed, lt.Name, key.ID, i+1, true_, v10, lt.Error)
			}
			if i > 0 && key.Denied > lt.Keys[i-1].Denied {
				t.Errorf("seed %d: %s: keys not heaviest first at %d", seed, lt.Name, i+1)
			}
			if key.Fullness != m.fullness[key.ID] {
				t.Errorf("seed %d: %s: key %s fullness %v, its latest %v", seed, lt.Name, key.ID, key.Fullness, m.fullness[key.ID])
			}
			listed[key.ID] = true
			if i < 10 && key.ID == all[i].id {
				exact++
			}
		}
		for _, x := range all[:10] {
			if x.n > v11+lt.Error && !listed[x.id] {
				t.Errorf("seed %d: %s: key %s denied %d times (true 11th: %d, error %d) is not listed", seed, lt.Name, x.id, x.n, v11, lt.Error)
			}
		}
		t.Logf("%s: %d denials, %d keys denied, error %d; top 10 in exact order: %d of 10", lt.Name, m.denials, len(all), lt.Error, exact)
	}
	byFull, err := k.Top(ctx, Query{Domain: "api", By: ByFullness})
	if err != nil {
		t.Fatal(err)
	}
	for _, lt := range byFull.Limits {
		m := tr.limits[lt.Name]
		var want, got []float64
		for _, f := range m.fullness {
			if f >= MinFullness {
				want = append(want, f)
			}
		}
		slices.Sort(want)
		slices.Reverse(want)
		for _, key := range lt.Keys {
			got = append(got, key.Fullness)
			if key.Fullness != m.fullness[key.ID] {
				t.Errorf("seed %d: %s by fullness: key %s at %v, its latest %v", seed, lt.Name, key.ID, key.Fullness, m.fullness[key.ID])
			}
		}
		if monotone[lt.Name] && !slices.Equal(got, want[:len(got)]) {
			t.Errorf("seed %d: %s by fullness: %v, the true 10 fullest %v", seed, lt.Name, got, want[:len(got)])
		}
		if len(got) != min(DefaultN, len(want)) {
			t.Errorf("seed %d: %s by fullness: %d keys, want %d", seed, lt.Name, len(got), min(DefaultN, len(want)))
		}
	}
}

// TestZipfTopOneProcess: a seeded Zipf trace on one process (memory
// store, a clock moving through one minute) gives the true top 10 of each
// limit within the stated error.
func TestZipfTopOneProcess(t *testing.T) {
	seed := storetest.Seed(t)
	var clk clock
	clk.set(t0)
	store := memstore.New(memstore.Options{Now: clk.now, SweepEvery: time.Hour})
	defer store.Close()
	keys := New(Options{Now: clk.now, K: sketchK})
	tr := &truthObserver{limits: map[string]*truth{}}
	svc := service.New(service.Options{Store: store, Now: clk.now, Observers: []service.Observer{keys, tr}})
	svc.SetConfig(mustParse(t, zipfConfig))
	zipfTrace(t, seed, []*service.Service{svc}, &clk, 60000, 1, true)
	checkTop(t, seed, keys, tr, 1, map[string]bool{"remote_address/1m": true, "user/1h": true})
}

// TestZipfTopTwoProcessesOnRedis: the same on two processes sharing a
// Redis, each with its own sketches, merged through the board.
func TestZipfTopTwoProcessesOnRedis(t *testing.T) {
	seed := storetest.Seed(t)
	srv := redistest.Start(t)
	var clk clock
	clk.set(t0.Add(30 * time.Second))
	tr := &truthObserver{limits: map[string]*truth{}}
	cfg := mustParse(t, zipfConfig)
	var svcs []*service.Service
	var procs []*Keys
	for i := range 2 {
		store, err := redisstore.New(redisstore.Options{URL: srv.URL(), Now: clk.now, Prefix: "zipf:", Timeout: 5 * time.Second}) // generous: a busy machine
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		keys := New(Options{Now: clk.now, K: sketchK, Process: fmt.Sprintf("p%d", i), Board: store.Board("top")})
		svc := service.New(service.Options{Store: store, StoreDoesIO: true, Now: clk.now, Observers: []service.Observer{keys, tr}})
		svc.SetConfig(cfg)
		svcs, procs = append(svcs, svc), append(procs, keys)
	}
	zipfTrace(t, seed, svcs, &clk, 20000, 8, false)
	for _, k := range procs {
		if err := k.PublishOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// At a fixed instant every limit's fullness only grows.
	checkTop(t, seed, procs[0], tr, 2, map[string]bool{"remote_address/1m": true, "user/1h": true, "api_key/1m/token_bucket": true})
	// Each process alone sees its own half.
	one, err := procs[1].Top(context.Background(), Query{Domain: "api", Name: "remote_address/1m"})
	if err != nil || one.Processes != 2 || len(one.Limits) != 1 {
		t.Fatalf("Top(name=remote_address/1m) from the other process = %d processes, %d limits (%v); want 2 and 1", one.Processes, len(one.Limits), err)
	}
}

// TestPublishedSummaryExpires: each process publishes its summary on the
// board with a TTL of three publication periods, while it runs; Top counts
// the processes whose summaries are live, so a process that stops
// publishing (stopped, or cut off) drops out once its summary expires, and
// one that stops cleanly takes its summary off at once.
func TestPublishedSummaryExpires(t *testing.T) {
	srv := redistest.Start(t)
	var clk clock
	clk.set(t0)
	cfg := mustParse(t, zipfConfig)
	var procs []*Keys
	for i := range 3 {
		store, err := redisstore.New(redisstore.Options{URL: srv.URL(), Now: clk.now, Prefix: "ttl:", Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		keys := New(Options{Now: clk.now, Process: fmt.Sprintf("p%d", i), Board: store.Board("top"), Every: 10 * time.Second})
		svc := service.New(service.Options{Store: store, StoreDoesIO: true, Now: clk.now, Observers: []service.Observer{keys}})
		svc.SetConfig(cfg)
		for range 10 {
			if _, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "api", Descriptors: []service.Descriptor{
				{Entries: []config.Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}); err != nil {
				t.Fatal(err)
			}
		}
		procs = append(procs, keys)
	}
	ctx := context.Background()
	processes := func() (int, uint64) {
		t.Helper()
		res, err := procs[0].Top(ctx, Query{Domain: "api", Name: "remote_address/1m"})
		if err != nil || res.Note != "" || len(res.Limits) != 1 {
			t.Fatalf("Top: %+v, %v", res, err)
		}
		return res.Processes, res.Limits[0].Denials
	}
	if n, denials := processes(); n != 1 || denials != 2 {
		t.Fatalf("before any publication: %d processes, %d denials; want 1 and 2 (this one's)", n, denials)
	}
	pctx, stop := context.WithCancel(ctx)
	published := make(chan struct{})
	go func() { defer close(published); procs[1].Publish(pctx) }()
	if err := procs[2].PublishOnce(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // p1's first publication is at once
		if n, _ := processes(); n == 3 {
			break
		}
		if i == 1000 {
			t.Fatal("p1's summary never reached the board")
		}
		time.Sleep(time.Millisecond) // waits for p1's goroutine, measures nothing
	}
	// One counter: p0 admits 8 and denies 2, p1 and p2 deny their 10.
	if n, denials := processes(); n != 3 || denials != 22 {
		t.Errorf("with p1 and p2 published: %d processes, %d denials; want 3 and 22", n, denials)
	}
	ttl, err := redistest.Command(srv.Addr(), "PTTL", "ttl:board:{top}:p2")
	if ms, _ := strconv.Atoi(ttl); err != nil || ms <= 20000 || ms > 30000 {
		t.Errorf("PTTL of p2's summary = %q (%v), want in (20 s, 30 s]: three periods of 10 s", ttl, err)
	}
	// p2 stops publishing: Redis expires its summary.
	if _, err := redistest.Command(srv.Addr(), "PEXPIRE", "ttl:board:{top}:p2", "1"); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		n, denials := processes()
		if n == 2 && denials == 12 {
			break
		}
		if i == 1000 {
			t.Fatalf("p2's expired summary is still counted: %d processes, %d denials; want 2 and 12", n, denials)
		}
		time.Sleep(time.Millisecond) // waits for Redis's expiry, measures nothing
	}
	// p1 stops: it takes its summary off.
	stop()
	<-published
	if n, denials := processes(); n != 1 || denials != 2 {
		t.Errorf("after p1 stopped and p2 expired: %d processes, %d denials; want 1 and 2", n, denials)
	}
}
