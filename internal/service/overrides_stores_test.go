package service

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/redistest"
)

// replica is one rls process: a service on its own store connection and
// its own keeper of the overrides, following them until the test ends.
type replica struct {
	svc  *Service
	keep *overrides.Keeper
}

// startReplica starts a replica deciding on store, its overrides in b.
func startReplica(t *testing.T, cfg *config.Config, store engine.Store, b overrides.Backend, clock *storetest.Clock) *replica {
	t.Helper()
	keep := overrides.New(b, overrides.Options{Now: clock.Now})
	if err := keep.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { keep.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	svc := New(Options{Store: store, Overrides: keep, StoreDoesIO: true})
	svc.SetConfig(cfg)
	return &replica{svc: svc, keep: keep}
}

// decide asks r for hits of team=value, and returns the code and the
// limit it was decided under.
func (r *replica) decide(t *testing.T, value string, hits uint64) (Code, uint32) {
	t.Helper()
	d := desc("team", value)
	d.HasHits, d.Hits = true, hits
	resp, err := r.svc.ShouldRateLimit(context.Background(), &Request{Domain: "api", Descriptors: []Descriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Code, resp.Statuses[0].Limit.Rule.Limit
}

// TestOverridesOnStores: decisions under overrides on the memory store,
// Redis and a Redis Cluster of three masters, with a second replica on
// the same Redis: set, raised, lowered below what the window used (denied
// on both), 0, a prefix, deleted, and a temporary raise that expires, on
// one counter throughout; a replica started later (a restart) reads them.
func TestOverridesOnStores(t *testing.T) {
	cfg, err := config.Parse("limits.yaml", []byte(overridesConfig))
	if err != nil {
		t.Fatal(err)
	}
	type store struct {
		name string
		// open returns a replica's store and the overrides' backend;
		// shared says whether replicas share them.
		open   func(t *testing.T, clock *storetest.Clock) (engine.Store, overrides.Backend)
		shared bool
	}
	mem := func(t *testing.T, clock *storetest.Clock) (engine.Store, overrides.Backend) {
		ms := memstore.New(memstore.Options{Now: clock.Now})
		t.Cleanup(func() { ms.Close() })
		b, err := overrides.NewMemory("", clock.Now)
		if err != nil {
			t.Fatal(err)
		}
		return ms, b
	}
	onRedis := func(opts func() redisstore.Options) func(t *testing.T, clock *storetest.Clock) (engine.Store, overrides.Backend) {
		return func(t *testing.T, clock *storetest.Clock) (engine.Store, overrides.Backend) {
			o := opts()
			o.Now, o.Timeout, o.DenyCache = clock.Now, time.Second, true
			rs, err := redisstore.New(o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rs.Close() })
			return rs, rs.Overrides()
		}
	}
	var srv *redistest.Server
	var cluster *redistest.Cluster
	for _, s := range []store{
		{"memory", mem, false},
		{"redis", onRedis(func() redisstore.Options {
			if srv == nil {
				srv = redistest.Start(t)
			}
			return redisstore.Options{URL: srv.URL()}
		}), true},
		{"cluster", onRedis(func() redisstore.Options {
			if cluster == nil {
				cluster = redistest.StartCluster(t, 3, 0)
			}
			return redisstore.Options{ClusterSeeds: cluster.Seeds()}
		}), true},
	} {
		t.Run(s.name, func(t *testing.T) {
			clock := storetest.NewClock(storetest.T0.Add(5 * time.Second)) // a minute's window starts at T0
			st, b := s.open(t, clock)
			a := startReplica(t, cfg, st, b, clock)
			reps := []*replica{a}
			if s.shared {
				st2, b2 := s.open(t, clock)
				reps = append(reps, startReplica(t, cfg, st2, b2, clock))
			}
			set := func(value string, rpu uint32, ttl time.Duration) {
				t.Helper()
				c := overrides.Change{Key: overrides.Key{Domain: "api", Descriptor: []engine.Entry{{Key: "team", Value: value}}}, RequestsPerUnit: rpu, TTL: ttl}
				if _, err := a.keep.Set(context.Background(), c, "test"); err != nil {
					t.Fatal(err)
				}
			}
			// follow waits until every replica decides team=value under limit.
			follow := func(value string, limit uint32) {
				t.Helper()
				for _, r := range reps {
					deadline := time.Now().Add(20 * time.Second)
					for {
						ex, err := r.svc.Explain(context.Background(), &Request{Domain: "api", Descriptors: []Descriptor{desc("team", value)}})
						if err != nil {
							t.Fatal(err)
						}
						if ex.Descriptors[0].Limits[0].Limit.Rule.Limit == limit {
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("team=%s: a replica still decides under %d after 20s, want %d", value, ex.Descriptors[0].Limits[0].Limit.Rule.Limit, limit)
						}
						time.Sleep(time.Millisecond)
					}
				}
			}
			steps := []struct {
				what  string
				do    func()
				value string
				limit uint32
				hits  uint64
				want  Code
			}{
				{"set to 6: 4 hits", func() { set("acme", 6, 0) }, "acme", 6, 4, OK},
				{"raised to 9: 4 more", func() { set("acme", 9, 0) }, "acme", 9, 4, OK},
				{"lowered to 5, below the 8 used", func() { set("acme", 5, 0) }, "acme", 5, 1, OverLimit},
				{"blocked", func() { set("acme", 0, 0) }, "acme", 0, 1, OverLimit},
				{"a prefix of 20 covers acorn", func() { set("ac*", 20, 0) }, "acorn", 20, 20, OK},
				{"acme deleted: the prefix's 20, 8 used", func() {
					if _, err := a.keep.Delete(context.Background(), overrides.Key{Domain: "api", Descriptor: []engine.Entry{{Key: "team", Value: "acme"}}}, "test"); err != nil {
						t.Fatal(err)
					}
				}, "acme", 20, 12, OK},
				{"a raise to 30 for 10s", func() { set("acme", 30, 10*time.Second) }, "acme", 30, 10, OK},
				{"it expired: the prefix's 20 again, 30 used", func() { clock.Set(clock.Now().Add(10 * time.Second)) }, "acme", 20, 1, OverLimit},
			}
			for i, s := range steps {
				s.do()
				follow(s.value, s.limit)
				if code, limit := a.decide(t, s.value, s.hits); code != s.want || limit != s.limit {
					t.Errorf("step %d (%s): %d hits of team=%s: %s under %d, want %s under %d", i+1, s.what, s.hits, s.value, code, limit, s.want, s.limit)
				}
				if len(reps) > 1 && s.want == OverLimit {
					// The second replica, on the same counter, denies too.
					if code, _ := reps[1].decide(t, s.value, 1); code != OverLimit {
						t.Errorf("step %d (%s): the second replica admits a hit, want OVER_LIMIT (same counter)", i+1, s.what)
					}
				}
			}
			if !s.shared {
				return
			}
			// A restart: a replica started now reads them from Redis.
			st3, b3 := s.open(t, clock)
			c := startReplica(t, cfg, st3, b3, clock)
			if code, limit := c.decide(t, "acorn", 0); limit != 20 || code != OK {
				t.Errorf("a restarted replica: team=acorn %s under %d, want OK under the prefix's 20", code, limit)
			}
		})
	}
}
