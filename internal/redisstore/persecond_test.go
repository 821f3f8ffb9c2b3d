package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redistest"
)

// The conformance suite on a store whose windows under a minute live on a
// second Redis: its timelines are windows of seconds (per-second Redis) and
// of minutes and more (the first), and its all-or-nothing checks mix them.
func TestPerSecondConformance(t *testing.T) {
	first, second := redistest.Start(t), redistest.Start(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
		return newStore(t, Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}, Now: now})
	})
}

// countersOf returns the counters of srv under prefix.
func countersOf(t *testing.T, srv *redistest.Server, prefix string) []string {
	t.Helper()
	counters, err := redistest.Counters(func(args ...string) (string, error) { return redistest.Command(srv.Addr(), args...) }, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return counters
}

// TestPerSecondAllOrNothing: a request with a per-second and a per-minute
// limit, denied by either, consumes nothing on the other Redis; admitted,
// it consumes on both. Each counter lives on its own Redis: the per-second
// one on the second, the per-minute one on the first.
func TestPerSecondAllOrNothing(t *testing.T) {
	first, second := redistest.Start(t), redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}, Now: clock.Now})
	perSecond := storetest.Rule(engine.FixedWindow, 2, time.Second, 0)
	perMinute := storetest.Rule(engine.FixedWindow, 3, time.Minute, 0)
	ctx := context.Background()
	item := func(l *engine.Rule, hits uint64) engine.Item {
		return engine.Item{Desc: "d/user=u", Rule: l, Hits: hits}
	}
	res := make([]engine.Result, 2)
	ask := func(step string, items []engine.Item, want bool, wantRemaining ...uint64) {
		t.Helper()
		ok, err := s.Apply(ctx, items, res)
		if err != nil || ok != want {
			t.Fatalf("%s: Apply = %v, %v; want %v", step, ok, err, want)
		}
		s.releasing.Wait()
		for i, w := range wantRemaining {
			if res[i].Remaining != w {
				t.Errorf("%s: %s remaining %d, want %d", step, items[i].Rule.ID, res[i].Remaining, w)
			}
		}
	}
	ask("1 hit of each", []engine.Item{item(perSecond, 1), item(perMinute, 1)}, true, 1, 2)
	if got, want := countersOf(t, second, "rls:"), []string{"rls:{d/user=u}:fw1s"}; !slices.Equal(got, want) {
		t.Errorf("counters on the per-second Redis: %q, want %q", got, want)
	}
	if got, want := countersOf(t, first, "rls:"), []string{"rls:{d/user=u}:fw60s"}; !slices.Equal(got, want) {
		t.Errorf("counters on the first Redis: %q, want %q", got, want)
	}
	// Denied by the per-second limit (2 more of 1 left): the minute keeps its 2.
	ask("denied by the second", []engine.Item{item(perSecond, 2), item(perMinute, 2)}, false, 1, 2)
	// Denied by the per-minute limit (3 of 2 left): the second keeps its 1.
	ask("denied by the minute", []engine.Item{item(perMinute, 3), item(perSecond, 1)}, false, 2, 1)
	ask("what is left of each", []engine.Item{item(perSecond, 1), item(perMinute, 2)}, true, 0, 0)
	if st := s.Stats(); st.Releases == 0 {
		t.Errorf("stats %+v: no reservation released", st)
	}
}

// TestPerSecondQuotaGroupSplit: a quota descriptor whose windows sit on
// both Redis servers, over as a whole while another quota descriptor
// passes: the request is admitted and the over descriptor consumes
// nothing, on neither store, with the memory store's statuses. Its share on
// the Redis where it admits was judged apart and reserved: it is given back
// and reserved again with the descriptor told over.
func TestPerSecondQuotaGroupSplit(t *testing.T) {
	first, second := redistest.Start(t), redistest.Start(t)
	perSecond := storetest.Rule(engine.FixedWindow, 1, time.Second, 0)
	perMinute := storetest.Rule(engine.FixedWindow, 5, time.Minute, 0)
	tight := storetest.Rule(engine.FixedWindow, 1, time.Minute, 0)
	tight.ID += ":5:tight"
	// Two limits of one counter (as an override shares a configured
	// limit's): the second item sees the first one's tentative hits.
	roomy := storetest.Rule(engine.FixedWindow, 10, time.Second, 0)
	roomy.ID += ":shared"
	small := storetest.Rule(engine.FixedWindow, 3, time.Second, 0)
	small.ID = roomy.ID
	for _, tc := range []struct {
		name        string
		setup, req  []engine.Item
		look        []engine.Item
		wantOK      bool
		wantRegroup bool
	}{
		{
			name:  "its second over, its minute admits",
			setup: []engine.Item{{Desc: "d/q=over", Rule: perSecond, Hits: 1}},
			req: []engine.Item{
				{Desc: "d/q=over", Rule: perSecond, Hits: 1, Group: 1},
				{Desc: "d/q=over", Rule: perMinute, Hits: 1, Group: 1},
				{Desc: "d/q=passes", Rule: perMinute, Hits: 1, Group: 2},
			},
			look:   []engine.Item{{Desc: "d/q=over", Rule: perMinute}, {Desc: "d/q=passes", Rule: perMinute}},
			wantOK: true, wantRegroup: true,
		},
		{
			// Its minute is over; on the second's counter, the shadow
			// item is denied only by the first item's tentative hits:
			// judged again, it must still be (its hits not taken).
			name: "its minute over, a later item on a shared counter",
			req: []engine.Item{
				{Desc: "d/q=over", Rule: roomy, Hits: 2, Group: 1},
				{Desc: "d/q=over", Rule: small, Hits: 2, Group: 1, Shadow: true},
				{Desc: "d/q=over", Rule: tight, Hits: 2, Group: 1},
				{Desc: "d/q=passes", Rule: perMinute, Hits: 1, Group: 2},
			},
			look:   []engine.Item{{Desc: "d/q=over", Rule: roomy}, {Desc: "d/q=over", Rule: tight}, {Desc: "d/q=passes", Rule: perMinute}},
			wantOK: true, wantRegroup: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := storetest.NewClock(storetest.T0)
			s := newStore(t, Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}, Now: clock.Now,
				Prefix: strings.ReplaceAll(tc.name, " ", "_") + ":"})
			mem := memstore.New(memstore.Options{Now: clock.Now})
			t.Cleanup(func() { mem.Close() })
			ctx := context.Background()
			apply := func(step string, items []engine.Item, wantOK bool) {
				t.Helper()
				got, want := make([]engine.Result, len(items)), make([]engine.Result, len(items))
				gok, err := s.Apply(ctx, items, got)
				if err != nil || gok != wantOK {
					t.Fatalf("%s: Apply = %v, %v; want %v", step, gok, err, wantOK)
				}
				if wok, _ := mem.Apply(ctx, items, want); wok != gok || !slices.Equal(got, want) {
					t.Errorf("%s:\nredis  %v %+v\nmemory %v %+v", step, gok, got, wok, want)
				}
			}
			if tc.setup != nil {
				apply("setup", tc.setup, true)
			}
			apply("quota descriptors, one over and one passing", tc.req, tc.wantOK)
			apply("look afterwards", tc.look, true)
			if got := s.regrouped.Load(); (got > 0) != tc.wantRegroup {
				t.Errorf("%d quota groups settled again, want some: %v", got, tc.wantRegroup)
			}
		})
	}
}

// TestPerSecondDifferential: random requests over descriptors whose
// windows sit on both Redis servers (per-second ones on the second), with
// refunds, shadow items, count-denied hits, limits that share a counter,
// and quota descriptors (several per request, so that one whose windows
// are split between the stores can be over while another passes), get
// exactly the memory store's answers at the same instants.
func TestPerSecondDifferential(t *testing.T) {
	first, second := redistest.Start(t), redistest.Start(t)
	t.Run("single", func(t *testing.T) {
		testPerSecondDifferential(t, Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}}, false)
	})
	t.Run("deny cache", func(t *testing.T) {
		testPerSecondDifferential(t, Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}, DenyCache: true}, false)
	})
	// Hot: one-hit requests hammering limits of one, on a window of each
	// store or a per-second one, so that many are answered from the two
	// denial caches together.
	t.Run("deny cache hot", func(t *testing.T) {
		testPerSecondDifferential(t, Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}, DenyCache: true}, true)
	})
	t.Run("per-second cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		testPerSecondDifferential(t, Options{URL: first.URL(), PerSecond: &Options{ClusterSeeds: c.Seeds()}}, false)
	})
}

func testPerSecondDifferential(t *testing.T, opts Options, hot bool) {
	seed := storetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	clock := storetest.NewClock(storetest.T0)
	opts.Now = clock.Now
	opts.Prefix = fmt.Sprintf("psdiff%d:%s:", seed, strings.ReplaceAll(t.Name(), " ", "_"))
	s := newStore(t, opts)
	mem := memstore.New(memstore.Options{Now: clock.Now, SweepEvery: time.Hour}) // no sweeps: counters are forgotten when touched, as Redis forgets them
	t.Cleanup(func() { mem.Close() })

	var limits []*engine.Rule
	for _, alg := range storetest.Algorithms() {
		for _, w := range []time.Duration{time.Second, 2 * time.Second, time.Minute, time.Hour} {
			for _, rpu := range []uint32{1, 3, 10} {
				burst := uint32(0)
				if alg == engine.TokenBucket {
					burst = rpu + uint32(rng.IntN(3))
				}
				l := storetest.Rule(alg, rpu, w, burst)
				l.ID = storetest.WindowID(l)
				if rpu >= 3 {
					l.ID += ":shared" // the 3 and the 10 share a counter, as an override does
				}
				limits = append(limits, l)
			}
		}
	}
	reserving := reservingLimits(rng)
	if !hot {
		limits = append(limits, reserving...)
	}
	descs := []string{"d/a=1", "d/a=2", "d/b=1"}
	mean := 700 * time.Millisecond
	if hot {
		ones := limits[:0:0]
		for _, l := range limits {
			if l.Limit == 1 {
				ones = append(ones, l)
			}
		}
		limits, descs, mean = ones, descs[:2], 100*time.Millisecond
	}
	var denied, split int
	const steps = 400
	for step := range steps {
		d := time.Duration(rng.ExpFloat64() * float64(mean))
		if rng.IntN(15) == 0 {
			d = -d // the clock steps back: every store holds its counters where they were
		}
		clock.Set(clock.Now().Add(d))
		// Quota descriptors: every item of such a descriptor is in its
		// group, as the service builds them.
		quota := map[string]int32{}
		for k, desc := range descs {
			if rng.IntN(3) == 0 {
				quota[desc] = int32(k + 1)
			}
		}
		items := make([]engine.Item, 2+rng.IntN(4))
		if hot {
			// a window of each store, or (to fill the per-second windows
			// that denials by the longer ones leave alone) a per-second one
			items = items[:1+rng.IntN(2)]
		}
		for i := range items {
			it := &items[i]
			it.Desc = descs[rng.IntN(len(descs))]
			it.Rule = limits[rng.IntN(len(limits))]
			if hot {
				// one window of each store, one hit, nothing else
				it.Desc = items[0].Desc
				for perSecondLimit(it.Rule) != (i == 0) {
					it.Rule = limits[rng.IntN(len(limits))]
				}
				it.Hits = 1
				continue
			}
			it.Hits = uint64(rng.IntN(3))
			it.Refund = rng.IntN(6) == 0
			if it.Refund {
				it.Hits = uint64(1 + rng.IntN(5))
			}
			it.Shadow = rng.IntN(12) == 0
			it.CountDenied = !it.Refund && rng.IntN(8) == 0
			it.Group = quota[it.Desc]
			if rng.IntN(3) == 0 {
				// a few counters that reserve (per-second windows and longer
				// ones), so that ids meet
				it.Rule = reserving[rng.IntN(len(reserving))%6*6]
			}
			drawReservation(rng, it)
		}
		perSecond := 0
		for i := range items {
			if perSecondLimit(items[i].Rule) {
				perSecond++
			}
		}
		if perSecond > 0 && perSecond < len(items) {
			split++
		}
		if !decideBoth(t, step, seed, clock.Now().Sub(storetest.T0), s, s.releasing.Wait, mem, items) {
			denied++
		}
	}
	st := s.Stats()
	regrouped := s.regrouped.Load()
	t.Logf("%d of %d requests on both stores, %d denied, %d releases, %d quota groups settled again, %d answered from the denial cache",
		split, steps, denied, st.Releases, regrouped, st.CacheHits)
	if split < steps/3 || denied < steps/10 || st.Releases == 0 {
		t.Errorf("%d split, %d denied, %d releases: the comparison did not cover requests denied across the stores", split, denied, st.Releases)
	}
	if hot && s.cacheHits.Load() == 0 { // the first store's own: requests on both stores (the others are on the second only)
		t.Errorf("no request on both stores answered from the denial caches")
	}
}

// BenchmarkPerSecond: one request at a time of a descriptor's three windows
// (1 s, 1 min, 1 h; limits never reached), on one Redis, and with the
// per-second window on a second one (a reservation on each, concurrently).
// The figure is the latency of one decision, round trips included.
func BenchmarkPerSecond(b *testing.B) {
	first, second := redistest.Start(b), redistest.Start(b)
	wins := []*engine.Rule{
		storetest.Rule(engine.FixedWindow, 1<<30, time.Second, 0),
		storetest.Rule(engine.FixedWindow, 1<<30, time.Minute, 0),
		storetest.Rule(engine.SlidingWindow, 1<<30, time.Hour, 0),
	}
	items := make([]engine.Item, len(wins))
	for i, l := range wins {
		items[i] = engine.Item{Desc: "bench/k=v", Rule: l, Hits: 1}
	}
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"one Redis", Options{URL: first.URL()}},
		{"per-second Redis", Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}}},
		{"per-second store on the same Redis", Options{URL: first.URL(), PerSecond: &Options{URL: first.URL()}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := newStore(b, tc.opts)
			results := make([]engine.Result, len(items))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Apply(context.Background(), items, results); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
