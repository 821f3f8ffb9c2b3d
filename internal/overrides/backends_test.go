package overrides

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/redistest"
)

// proc is one rls process's keeper of the overrides, following its
// backend (Run) until the test ends.
type proc struct {
	k    *Keeper
	stop func()
}

// deployment makes the processes of one kind of store: memory (one
// process; the "restart" reads its file), Redis or a Redis Cluster (every
// process on the same Redis).
type deployment struct {
	name   string
	shared bool // processes share the overrides
	start  func(t *testing.T) *proc
}

func deployments(t *testing.T, clock *storetest.Clock, cfg *config.Config) []deployment {
	file := filepath.Join(t.TempDir(), "overrides.json")
	startOn := func(b Backend) func(t *testing.T) *proc {
		return func(t *testing.T) *proc { return startProc(t, b, clock, cfg) }
	}
	redisProcs := func(opts redisstore.Options) func(t *testing.T) *proc {
		return func(t *testing.T) *proc {
			opts.Now = clock.Now
			s, err := redisstore.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return startProc(t, s.Overrides(), clock, cfg)
		}
	}
	return []deployment{
		{"memory", false, func(t *testing.T) *proc {
			m, err := NewMemory(file, clock.Now)
			if err != nil {
				t.Fatal(err)
			}
			return startOn(m)(t)
		}},
		{"redis", true, redisProcs(redisstore.Options{URL: redistest.Start(t).URL()})},
		{"cluster", true, redisProcs(redisstore.Options{ClusterSeeds: redistest.StartCluster(t, 3, 0).Seeds()})},
	}
}

// startProc starts a keeper of b bound to cfg, following b until the test
// ends (or stop).
func startProc(t *testing.T, b Backend, clock *storetest.Clock, cfg *config.Config) *proc {
	t.Helper()
	k := New(b, Options{Now: clock.Now})
	if err := k.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	k.Bind(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { k.Run(ctx) })
	var once sync.Once
	p := &proc{k: k, stop: func() { once.Do(func() { cancel(); wg.Wait() }) }}
	t.Cleanup(p.stop)
	return p
}

// rpu returns what tenant=value's limit tenant/1m counts with at p.
func (p *proc) rpu(cfg *config.Config, value string) uint32 {
	es := entries("tenant=" + value)
	l := cfg.Domain("api").Match(es).Limits[0]
	return p.k.Table(cfg).Apply("api", es, l).Rule.Limit
}

// follows waits until p's tenant=value counts with want (a notice, or the
// poll of the version), and returns how long that took; it fails the test
// after 20 s (a loaded machine; by design a change arrives within a
// second: its notice at once, else the next poll).
func (p *proc) follows(t *testing.T, cfg *config.Config, value string, want uint32) time.Duration {
	t.Helper()
	start := time.Now()
	for p.rpu(cfg, value) != want {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("tenant=%s counts with %d after 20s, want %d", value, p.rpu(cfg, value), want)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// TestBackends: on each store, overrides are set, changed (raised,
// lowered, 0), deleted and expired on one process, and followed by a
// second one sharing the store; a process started later (a restart)
// reads them; a process whose notices are lost catches up at its poll.
func TestBackends(t *testing.T) {
	cfg, err := config.Parse("limits.yaml", []byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(t0)
	ctx := context.Background()
	for _, d := range deployments(t, clock, cfg) {
		t.Run(d.name, func(t *testing.T) {
			a := d.start(t)
			var b *proc
			if d.shared {
				b = d.start(t)
			}
			set := func(value string, rpu uint32, ttl time.Duration) {
				t.Helper()
				c := Change{Key: Key{Domain: "api", Descriptor: entries("tenant=" + value)}, RequestsPerUnit: rpu, TTL: ttl}
				if _, err := a.k.Set(ctx, c, "test"); err != nil {
					t.Fatalf("set tenant=%s %d: %v", value, rpu, err)
				}
			}
			steps := []struct {
				what  string
				do    func()
				value string
				want  uint32
			}{
				{"set", func() { set("acme", 500, 0) }, "acme", 500},
				{"raised", func() { set("acme", 900, 0) }, "acme", 900},
				{"lowered", func() { set("acme", 3, 0) }, "acme", 3},
				{"blocked", func() { set("acme", 0, 0) }, "acme", 0},
				{"a prefix", func() { set("ac*", 7, 0) }, "acorn", 7},
				{"deleted", func() {
					if _, err := a.k.Delete(ctx, Key{Domain: "api", Descriptor: entries("tenant=acme")}, "test"); err != nil {
						t.Fatal(err)
					}
				}, "acme", 7},
				{"a temporary raise for 30s", func() { set("beta", 60, 30*time.Second) }, "beta", 60},
			}
			for i, s := range steps {
				s.do()
				if got := a.rpu(cfg, s.value); got != s.want {
					t.Errorf("step %d (%s): the process that set it: tenant=%s counts with %d, want %d", i+1, s.what, s.value, got, s.want)
				}
				if b != nil {
					took := b.follows(t, cfg, s.value, s.want)
					t.Logf("step %d (%s): the second process applied it after %s", i+1, s.what, took)
				}
			}
			// A delete of none is ErrNotFound.
			if _, err := a.k.Delete(ctx, Key{Domain: "api", Descriptor: entries("tenant=nobody")}, "test"); !errors.Is(err, ErrNotFound) {
				t.Errorf("delete of no override: %v, want ErrNotFound", err)
			}
			// The temporary raise ends at its instant on every process, by
			// the store's clock (the test's here).
			clock.Set(clock.Now().Add(30 * time.Second))
			for _, p := range []*proc{a, b} {
				if p != nil {
					if got := p.rpu(cfg, "beta"); got != 10 {
						t.Errorf("after its ttl: tenant=beta counts with %d, want the config's 10", got)
					}
				}
			}
			// It is removed from the store (as Run purges it).
			a.k.purge(ctx)
			beta := Key{Domain: "api", Descriptor: entries("tenant=beta")}.ID()
			if rec, err := a.k.backend.Get(ctx, beta); err != nil || rec != nil {
				t.Errorf("after its ttl and a purge, the store holds %q, %v; want nothing", rec, err)
			}
			// A restart: a new process reads what is kept.
			a.stop()
			if b != nil {
				b.stop()
			}
			c := d.start(t)
			for value, want := range map[string]uint32{"acme": 7, "acorn": 7, "beta": 10, "other": 10} {
				if got := c.rpu(cfg, value); got != want {
					t.Errorf("after a restart: tenant=%s counts with %d, want %d", value, got, want)
				}
			}
			if n := len(c.k.List("")); n != 1 {
				t.Errorf("after a restart: %d overrides listed, want 1 (the prefix; acme deleted, beta expired): %+v", n, c.k.List(""))
			}
			if !d.shared {
				return
			}
			// A process that misses a notice catches up at its poll.
			deaf := New(c.k.backend, Options{Now: clock.Now}) // never Run: hears no notice
			if err := deaf.Load(ctx); err != nil {
				t.Fatal(err)
			}
			deaf.Bind(cfg)
			if _, err := c.k.Set(ctx, Change{Key: Key{Domain: "api", Descriptor: entries("tenant=gamma")}, RequestsPerUnit: 77}, "test"); err != nil {
				t.Fatal(err)
			}
			dp := &proc{k: deaf}
			if got := dp.rpu(cfg, "gamma"); got != 10 {
				t.Fatalf("before its poll, the deaf process: %d, want the config's 10 (the test's premise)", got)
			}
			deaf.poll(ctx)
			if got := dp.rpu(cfg, "gamma"); got != 77 {
				t.Errorf("after its poll, the deaf process: tenant=gamma counts with %d, want 77", got)
			}
		})
	}
}

// failing is a backend that fails every call while down.
type failing struct {
	Backend
	down bool
}

var errDown = errors.New("the store is down")

func (f *failing) Load(ctx context.Context) (map[string][]byte, uint64, error) {
	if f.down {
		return nil, 0, errDown
	}
	return f.Backend.Load(ctx)
}

func (f *failing) Poll(ctx context.Context) (uint64, time.Time, error) {
	if f.down {
		return 0, time.Time{}, errDown
	}
	return f.Backend.Poll(ctx)
}

// TestStaleKeepsLastCopy: a process that cannot read the store keeps
// deciding with the last copy it read, and says so (Status), until it
// reads again.
func TestStaleKeepsLastCopy(t *testing.T) {
	f := newFixture(t, "")
	f.set(t, "tenant=acme", "", 500)
	fb := &failing{Backend: f.k.backend}
	k := New(fb, Options{Now: f.clock})
	ctx := context.Background()
	if err := k.Load(ctx); err != nil {
		t.Fatal(err)
	}
	k.Bind(f.cfg)
	p := &proc{k: k}
	fb.down = true
	k.poll(ctx)
	if st := k.Status(); st.Stale == nil || st.Count != 1 {
		t.Errorf("status while down: %+v, want stale with 1 override", st)
	}
	if got := p.rpu(f.cfg, "acme"); got != 500 {
		t.Errorf("while down: tenant=acme counts with %d, want the last copy's 500", got)
	}
	fb.down = false
	k.poll(ctx)
	if st := k.Status(); st.Stale != nil {
		t.Errorf("status once up: %+v, want not stale", st)
	}
}

// TestReloadKeepsUnmatched: an override that a reload leaves without a
// limit is kept, listed inactive, and applies again when its limit comes
// back.
func TestReloadKeepsUnmatched(t *testing.T) {
	f := newFixture(t, "")
	f.set(t, "tenant=acme", "daily", 5000)
	without, err := config.Parse("limits.yaml", []byte("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f.k.Bind(without)
	l := f.k.List("api")
	if len(l) != 1 || l[0].Active || len(l[0].Problems) == 0 {
		t.Fatalf("after a reload without daily: %+v, want one inactive override saying why", l)
	}
	f.k.Bind(f.cfg)
	if got := f.limitOf(t, "tenant=acme", "daily"); got != 5000 {
		t.Errorf("daily back: tenant=acme's daily counts with %d, want the override's 5000", got)
	}
	if l := f.k.List("api"); len(l) != 1 || !l[0].Active {
		t.Errorf("daily back: %+v, want it active", l)
	}
}
