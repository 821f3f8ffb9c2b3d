package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redistest"
)

func TestClusterConformance(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
		return newStore(t, Options{ClusterSeeds: c.Seeds(), Now: now})
	})
}

// descsOnDistinctMasters finds n descriptor identities whose counters live
// on n different masters.
func descsOnDistinctMasters(t *testing.T, c *redistest.Cluster, s *Store, l *engine.Rule, n int) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	for i := 0; len(out) < n && i < 1000; i++ {
		d := fmt.Sprintf("d/user=u%d", i)
		m := c.Master(c.KeySlot(s.base(&engine.Item{Desc: d, Rule: l})))
		if !seen[m.Addr()] {
			seen[m.Addr()] = true
			out = append(out, d)
		}
	}
	if len(out) < n {
		t.Fatalf("found descriptors on only %d masters", len(out))
	}
	return out
}

// oneHitEach returns an item of one hit for every limit of every descriptor.
func oneHitEach(descs []string, limits []*engine.Rule) []engine.Item {
	var items []engine.Item
	for _, d := range descs {
		for _, l := range limits {
			items = append(items, engine.Item{Desc: d, Rule: l, Hits: 1})
		}
	}
	return items
}

// TestClusterAllOrNothingAcrossMasters: a request whose descriptors live on
// three masters, one of which denies, consumes nothing on the other two.
func TestClusterAllOrNothingAcrossMasters(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{ClusterSeeds: c.Seeds(), Now: clock.Now})
	windows := []*engine.Rule{
		storetest.Rule(engine.FixedWindow, 5, time.Minute, 0),
		storetest.Rule(engine.TokenBucket, 5, time.Minute, 5),
		storetest.Rule(engine.SlidingLog, 5, time.Minute, 0),
	}
	descs := descsOnDistinctMasters(t, c, s, windows[0], 3)
	items := oneHitEach(descs, windows)
	strict := storetest.Rule(engine.FixedWindow, 1, time.Minute, 0)
	strict.ID += ":6:strict"
	ctx := context.Background()
	results := make([]engine.Result, len(items)+1)
	// Use up the strict limit of the third descriptor.
	if ok, err := s.Apply(ctx, []engine.Item{{Desc: descs[2], Rule: strict, Hits: 1}}, results); err != nil || !ok {
		t.Fatalf("setup: %v %v", ok, err)
	}
	withStrict := append(append([]engine.Item{}, items...), engine.Item{Desc: descs[2], Rule: strict, Hits: 1})
	for i := range 3 {
		ok, err := s.Apply(ctx, withStrict, results)
		if err != nil || ok {
			t.Fatalf("request %d across 3 masters with one denying: %v %v, want denied", i, ok, err)
		}
	}
	s.releasing.Wait() // releases run in the background
	if s.Stats().Releases == 0 {
		t.Error("no reservation was released")
	}
	// Nothing was consumed: every window still has all 5 on every master.
	look := make([]engine.Item, len(items))
	for i := range items {
		look[i] = items[i]
		look[i].Hits = 0
	}
	if ok, err := s.Apply(ctx, look, results); err != nil || !ok {
		t.Fatalf("look: %v %v", ok, err)
	}
	for i := range look {
		if results[i].Remaining != 5 {
			t.Errorf("%s %s: remaining %d after denied requests, want 5 (nothing consumed)", look[i].Desc, look[i].Rule.Algorithm(), results[i].Remaining)
		}
	}
	// Admitted across masters: consumed everywhere.
	if ok, err := s.Apply(ctx, items, results); err != nil || !ok {
		t.Fatalf("request without the strict limit: %v %v, want admitted", ok, err)
	}
	for i := range items {
		if results[i].Remaining != 4 {
			t.Errorf("%s %s: remaining %d, want 4", items[i].Desc, items[i].Rule.Algorithm(), results[i].Remaining)
		}
	}
}

// TestClusterDeniedStatuses: the statuses of a request denied on another
// master read as if nothing had been consumed (remaining and reset), exactly
// as the memory store, which never reserves, reports them at the same
// instants. Refunds in the request are undone too.
func TestClusterDeniedStatuses(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	clock := storetest.NewClock(storetest.T0)
	cl := newStore(t, Options{ClusterSeeds: c.Seeds(), Now: clock.Now})
	mem := memstore.New(memstore.Options{Now: clock.Now, SweepEvery: time.Hour}) // no sweeps: counters are forgotten when touched, as Redis forgets them
	t.Cleanup(func() { mem.Close() })

	windows := []*engine.Rule{
		storetest.Rule(engine.FixedWindow, 5, time.Minute, 0),
		storetest.Rule(engine.SlidingWindow, 5, time.Minute, 0),
		storetest.Rule(engine.TokenBucket, 5, time.Minute, 3),
		storetest.Rule(engine.SlidingLog, 5, time.Minute, 0),
	}
	descs := descsOnDistinctMasters(t, c, cl, windows[0], 3)
	items := oneHitEach(descs, windows)
	refund := engine.Item{Desc: descs[0], Rule: storetest.Rule(engine.FixedWindow, 9, time.Minute, 0), Hits: 2}
	strict := storetest.Rule(engine.FixedWindow, 1, time.Minute, 0)
	strict.ID += ":6:strict"
	ctx := context.Background()
	apply := func(step string, req []engine.Item, wantOK bool) {
		t.Helper()
		got := make([]engine.Result, len(req))
		want := make([]engine.Result, len(req))
		ok, err := cl.Apply(ctx, req, got)
		if err != nil || ok != wantOK {
			t.Fatalf("%s: cluster %v %v, want %v", step, ok, err, wantOK)
		}
		if ok, err := mem.Apply(ctx, req, want); err != nil || ok != wantOK {
			t.Fatalf("%s: memstore %v %v, want %v", step, ok, err, wantOK)
		}
		for i := range req {
			if got[i] != want[i] {
				t.Errorf("%s: %s %s: cluster %+v, memstore %+v", step, req[i].Desc, req[i].Rule.ID, got[i], want[i])
			}
		}
	}
	apply("fill the refunded counter", []engine.Item{refund, refund}, true)
	apply("use up the strict limit", []engine.Item{{Desc: descs[2], Rule: strict, Hits: 1}}, true)
	clock.Set(clock.Now().Add(5 * time.Second))
	withRefund := append(append([]engine.Item{}, items...), engine.Item{Desc: refund.Desc, Rule: refund.Rule, Hits: 1, Refund: true})
	apply("admitted across masters", withRefund, true)
	clock.Set(clock.Now().Add(5 * time.Second))
	denied := append(append([]engine.Item{}, withRefund...), engine.Item{Desc: descs[2], Rule: strict, Hits: 1})
	for i := range 3 {
		apply(fmt.Sprintf("denied %d", i), denied, false)
		clock.Set(clock.Now().Add(time.Second))
	}
	// A fresh descriptor: its bucket and log were empty before the denied
	// request reserved, so they must read full and empty again.
	master := func(d string) string {
		return c.Master(c.KeySlot(cl.base(&engine.Item{Desc: d, Rule: windows[0]}))).Addr()
	}
	fresh := "f/user=0"
	for i := 1; master(fresh) == master(descs[2]); i++ {
		fresh = fmt.Sprintf("f/user=%d", i)
	}
	var fr []engine.Item
	for _, l := range windows {
		fr = append(fr, engine.Item{Desc: fresh, Rule: l, Hits: 2})
	}
	apply("denied with fresh counters", append(fr, engine.Item{Desc: descs[2], Rule: strict, Hits: 1}), false)
}

// TestClusterReleaseAnnounced: when a request denied on another master
// releases its reservation, the released counters are announced, and
// another process drops the denial it cached for one of them. The
// reservation is made through an override that shares the counter of the
// configured limit with a higher rate, as overrides do.
func TestClusterReleaseAnnounced(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	clock := storetest.NewClock(storetest.T0)
	a := newStore(t, Options{ClusterSeeds: c.Seeds(), Now: clock.Now, DenyCache: true})
	b := newStore(t, Options{ClusterSeeds: c.Seeds(), Now: clock.Now})
	l := storetest.Rule(engine.FixedWindow, 5, time.Minute, 0)
	override := storetest.Rule(engine.FixedWindow, 10, time.Minute, 0)
	override.ID = l.ID
	descs := descsOnDistinctMasters(t, c, b, l, 2)
	strict := storetest.Rule(engine.FixedWindow, 1, time.Minute, 0)
	strict.ID += ":6:strict"
	ctx := context.Background()
	res := make([]engine.Result, 2)
	// a uses up descs[0]'s 5 and caches the denial of the 6th.
	if ok, err := a.Apply(ctx, []engine.Item{{Desc: descs[0], Rule: l, Hits: 5}}, res); err != nil || !ok {
		t.Fatalf("5 hits of 5: %v %v, want admitted", ok, err)
	}
	for i := range 2 {
		ok, err := a.Apply(ctx, []engine.Item{{Desc: descs[0], Rule: l, Hits: 1}}, res)
		if err != nil || ok || res[0].Cached != (i == 1) {
			t.Fatalf("ask %d after 5 of 5: %v %v cached %v; want denied, the second from the cache", i, ok, err, res[0].Cached)
		}
	}
	// b: a request reserving 1 hit of descs[0] (under the override) and
	// denied on descs[1]'s master.
	if ok, err := b.Apply(ctx, []engine.Item{{Desc: descs[1], Rule: strict, Hits: 1}}, res); err != nil || !ok {
		t.Fatalf("setup: %v %v", ok, err)
	}
	if ok, err := b.Apply(ctx, []engine.Item{{Desc: descs[0], Rule: override, Hits: 1}, {Desc: descs[1], Rule: strict, Hits: 1}}, res); err != nil || ok || !res[0].Admitted {
		t.Fatalf("request denied on one master: %v %v %+v; want denied with descs[0]'s part reserved", ok, err, res)
	}
	waitCacheEmpty(t, a, "the release was not announced to the other process within 5 s")
}

// TestClusterDifferential: random requests over descriptors on three
// masters, with refunds, shadow and quota items, limits that share a
// counter, and requests denied on one master after the others reserved,
// get from the cluster exactly the memory store's answers at the same
// instants: a released reservation leaves the statuses of a request denied
// on one node.
func TestClusterDifferential(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	seed := storetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	clock := storetest.NewClock(storetest.T0)
	cl := newStore(t, Options{ClusterSeeds: c.Seeds(), Now: clock.Now})
	mem := memstore.New(memstore.Options{Now: clock.Now, SweepEvery: time.Hour}) // no sweeps: counters are forgotten when touched, as Redis forgets them
	t.Cleanup(func() { mem.Close() })

	var limits []*engine.Rule
	for _, alg := range storetest.Algorithms() {
		for _, rpu := range []uint32{1, 3, 10} {
			burst := uint32(0)
			if alg == engine.TokenBucket {
				burst = rpu + uint32(rng.IntN(3))
			}
			l := storetest.Rule(alg, rpu, time.Minute, burst)
			if rpu >= 3 {
				l.ID += ":shared" // the 3 and the 10 share a counter, as an override does
			}
			limits = append(limits, l)
		}
	}
	descs := descsOnDistinctMasters(t, c, cl, limits[0], 3)
	denied := 0
	const steps = 400
	for step := range steps {
		d := time.Duration(rng.ExpFloat64() * float64(2*time.Second))
		if rng.IntN(15) == 0 {
			d = -d // the clock steps back: every store holds its counters where they were
		}
		clock.Set(clock.Now().Add(d))
		items := make([]engine.Item, 2+rng.IntN(4))
		for i := range items {
			it := &items[i]
			it.Desc = descs[rng.IntN(len(descs))]
			it.Rule = limits[rng.IntN(len(limits))]
			it.Hits = uint64(rng.IntN(3))
			it.Refund = rng.IntN(6) == 0
			if it.Refund {
				it.Hits = uint64(1 + rng.IntN(5))
			}
			it.Shadow = rng.IntN(12) == 0
			it.CountDenied = !it.Refund && rng.IntN(8) == 0
			if rng.IntN(10) == 0 {
				it.Group = 1
			}
		}
		if !decideBoth(t, step, seed, clock.Now().Sub(storetest.T0), cl, cl.releasing.Wait, mem, items) {
			denied++
		}
	}
	t.Logf("%d of %d requests denied, %d releases", denied, steps, cl.Stats().Releases)
	if denied < steps/10 || cl.Stats().Releases == 0 {
		t.Errorf("%d denied, %d releases: the comparison did not cover released reservations", denied, cl.Stats().Releases)
	}
}
