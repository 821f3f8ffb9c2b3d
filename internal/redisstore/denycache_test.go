package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

// TestDenyCacheStats: the denial cache counts its lookups and hits (one
// per request), holds its entries, and tells the entries dropped to make
// room while they held (evicted) from those dropped past their instant
// (expired) and from those a newer denial replaced (overwritten).
// envoyproxy/ratelimit's compatibility mode exports them as its local
// cache's stats.
func TestDenyCacheStats(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0.Add(10 * time.Second))
	s := newStore(t, Options{URL: srv.URL(), Now: clock.Now, DenyCache: true, DenyCacheSize: 2})
	if _, ok := newStore(t, Options{URL: srv.URL()}).DenyCacheStats(); ok {
		t.Error("DenyCacheStats of a store without denial cache: ok, want false")
	}
	minute := storetest.Rule(engine.FixedWindow, 1, time.Minute, 0)
	// An override sharing the counter under another limit (its burst is
	// part of what a cached denial was computed under).
	override := *minute
	override.Burst = 7
	apply := func(desc string, l *engine.Rule) bool {
		t.Helper()
		results := make([]engine.Result, 1)
		_, err := s.Apply(context.Background(), []engine.Item{{Desc: desc, Rule: l, Hits: 1}}, results)
		if err != nil {
			t.Fatal(err)
		}
		return results[0].Cached
	}
	type step = struct {
		what   string
		desc   string
		limit  *engine.Rule
		at     time.Duration
		cached bool
		want   DenyCacheStats
	}
	for i, st := range []step{
		{"a admitted", "d/k=a", minute, 10 * time.Second, false, DenyCacheStats{Lookups: 1}},
		{"a denied, cached", "d/k=a", minute, 10 * time.Second, false, DenyCacheStats{Lookups: 2, Entries: 1}},
		{"a from the cache", "d/k=a", minute, 11 * time.Second, true, DenyCacheStats{Lookups: 3, Hits: 1, Entries: 1}},
		{"a under the override: denied anew", "d/k=a", &override, 11 * time.Second, false, DenyCacheStats{Lookups: 4, Hits: 1, Entries: 1, Overwritten: 1}},
		{"b admitted", "d/k=b", minute, 12 * time.Second, false, DenyCacheStats{Lookups: 5, Hits: 1, Entries: 1, Overwritten: 1}},
		{"b denied, cached", "d/k=b", minute, 12 * time.Second, false, DenyCacheStats{Lookups: 6, Hits: 1, Entries: 2, Overwritten: 1}},
		{"c admitted", "d/k=c", minute, 13 * time.Second, false, DenyCacheStats{Lookups: 7, Hits: 1, Entries: 2, Overwritten: 1}},
		{"c denied: a full cache evicts one that holds", "d/k=c", minute, 13 * time.Second, false, DenyCacheStats{Lookups: 8, Hits: 1, Entries: 2, Overwritten: 1, Evicted: 1}},
		// The next minute: the two entries are past their instant.
		{"e admitted", "d/k=e", minute, 61 * time.Second, false, DenyCacheStats{Lookups: 9, Hits: 1, Entries: 2, Overwritten: 1, Evicted: 1}},
		{"e denied: the full cache drops what expired", "d/k=e", minute, 61 * time.Second, false, DenyCacheStats{Lookups: 10, Hits: 1, Entries: 1, Overwritten: 1, Evicted: 1, Expired: 2}},
	} {
		clock.Set(storetest.T0.Add(st.at))
		if cached := apply(st.desc, st.limit); cached != st.cached {
			t.Fatalf("step %d (%s): answered from the cache %v, want %v", i, st.what, cached, st.cached)
		}
		if got, ok := s.DenyCacheStats(); !ok || got != st.want {
			t.Fatalf("step %d (%s): DenyCacheStats() = %+v, %v; want %+v", i, st.what, got, ok, st.want)
		}
	}
}

// TestDenyCacheStatsPerSecond: with a per-second Redis, every request
// asks the denial cache once, whichever Redis holds its counters, and the
// counters are both stores' caches', as the reference's one local cache
// serves both its Redis. A request with only per-second limits was looked
// up in the per-second store's cache, which the stats left out: the
// reference's miss count ran one lower per such request (its integration
// test with REDIS_PERSECOND and a local cache).
func TestDenyCacheStatsPerSecond(t *testing.T) {
	first, second := redistest.Start(t), redistest.Start(t)
	clock := storetest.NewClock(storetest.T0.Add(10 * time.Second))
	s := newStore(t, Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}, Now: clock.Now, DenyCache: true})
	perSecond := storetest.Rule(engine.FixedWindow, 1, time.Second, 0)
	minute := storetest.Rule(engine.FixedWindow, 1, time.Minute, 0)
	apply := func(rules ...*engine.Rule) bool {
		t.Helper()
		items := make([]engine.Item, len(rules))
		for i, r := range rules {
			items[i] = engine.Item{Desc: "d/k=a", Rule: r, Hits: 1}
		}
		results := make([]engine.Result, len(items))
		if _, err := s.Apply(context.Background(), items, results); err != nil {
			t.Fatal(err)
		}
		return results[0].Cached
	}
	for i, st := range []struct {
		what   string
		rules  []*engine.Rule
		cached bool
		want   DenyCacheStats
	}{
		{"per-second admitted", []*engine.Rule{perSecond}, false, DenyCacheStats{Lookups: 1}},
		{"per-second denied, cached", []*engine.Rule{perSecond}, false, DenyCacheStats{Lookups: 2, Entries: 1}},
		{"per-second from the cache", []*engine.Rule{perSecond}, true, DenyCacheStats{Lookups: 3, Hits: 1, Entries: 1}},
		{"minute admitted", []*engine.Rule{minute}, false, DenyCacheStats{Lookups: 4, Hits: 1, Entries: 1}},
		// The per-second denial is learnt anew: it replaces the entry.
		{"both: the minute is over, denied on both, cached", []*engine.Rule{perSecond, minute}, false, DenyCacheStats{Lookups: 5, Hits: 1, Entries: 2, Overwritten: 1}},
		{"both from the caches", []*engine.Rule{perSecond, minute}, true, DenyCacheStats{Lookups: 6, Hits: 2, Entries: 2, Overwritten: 1}},
	} {
		if cached := apply(st.rules...); cached != st.cached {
			t.Fatalf("step %d (%s): answered from the cache %v, want %v", i, st.what, cached, st.cached)
		}
		if got, ok := s.DenyCacheStats(); !ok || got != st.want {
			t.Fatalf("step %d (%s): DenyCacheStats() = %+v, %v; want %+v", i, st.what, got, ok, st.want)
		}
	}
}

// TestDenyCacheFollowsOverride: a runtime override gives a limit another
// requests_per_unit on the same counter (engine.Rule.WithLimit). A denial
// cached under the configured limit does not answer under a raised one
// (the request goes to Redis and is admitted), and under a lowered one
// Redis denies what the counter has already used past it; the denial
// cached then answers only under that lowered limit.
func TestDenyCacheFollowsOverride(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0.Add(10 * time.Second))
	s := newStore(t, Options{URL: srv.URL(), Now: clock.Now, DenyCache: true})
	config := storetest.Rule(engine.FixedWindow, 3, time.Minute, 0)
	with := func(limit uint32) *engine.Rule {
		r, errs := config.WithLimit(limit, engine.Opt[uint32]{})
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		return r
	}
	raised, lowered := with(5), with(1)
	type step struct {
		what             string
		rule             *engine.Rule
		admitted, cached bool
	}
	for i, st := range []step{
		{"1 of 3", config, true, false},
		{"2 of 3", config, true, false},
		{"3 of 3", config, true, false},
		{"denied, cached", config, false, false},
		{"denied from the cache", config, false, true},
		{"raised to 5: to Redis, admitted (4 of 5)", raised, true, false},
		{"5 of 5", raised, true, false},
		{"denied under 5, cached", raised, false, false},
		{"from the cache under 5", raised, false, true},
		{"lowered to 1: to Redis, denied (5 used)", lowered, false, false},
		{"from the cache under 1", lowered, false, true},
		{"back to 3: to Redis, denied (5 used)", config, false, false},
	} {
		items := []engine.Item{{Desc: "d/tenant=acme", Rule: st.rule, Hits: 1}}
		results := make([]engine.Result, 1)
		ok, err := s.Apply(context.Background(), items, results)
		if err != nil {
			t.Fatal(err)
		}
		if ok != st.admitted || results[0].Cached != st.cached {
			t.Errorf("step %d (%s): admitted %v, from the cache %v; want %v, %v", i+1, st.what, ok, results[0].Cached, st.admitted, st.cached)
		}
	}
}
