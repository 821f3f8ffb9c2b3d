package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
)

func newStore(t testing.TB, opts Options) *Store {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second // generous: -race and a busy CI machine
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// As rls serve does: connected before the first request, an error
	// (Redis unreachable, a bad password) left for the requests to meet.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	s.Warm(ctx)
	cancel()
	if opts.DenyCache {
		waitLive(t, s)
	}
	return s
}

// waitCacheEmpty waits until s's denial caches hold nothing, or fails
// with msg after 5 s.
func waitCacheEmpty(t testing.TB, s *Store, msg string) {
	t.Helper()
	for range 500 {
		if st, _ := s.DenyCacheStats(); st.Entries == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal(msg)
}

// waitLive waits until the store follows the notices of freed hits on
// each of its Redis, so that its denial caches keep entries.
func waitLive(t testing.TB, s *Store) {
	t.Helper()
	for range 500 {
		if !slices.ContainsFunc(s.backends, func(b *backend) bool { return !b.cache.isLive() }) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the subscription to the freed notices was not confirmed within 5 s")
}

// cacheOf returns the denial cache of s's own Redis.
func cacheOf(s *Store) *denyCache { return s.backends[0].cache }

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
		return newStore(t, Options{URL: srv.URL(), Now: now})
	})
}

func TestConformanceWithDenyCache(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
		return newStore(t, Options{URL: srv.URL(), Now: now, DenyCache: true})
	})
}

// TestDifferential runs random request sequences through the Go algorithms
// (memstore) and the Lua script at the same instants and requires identical
// answers for every item.
func TestDifferential(t *testing.T) {
	srv := redistest.Start(t)
	t.Run("plain", func(t *testing.T) { testDifferential(t, srv, false, false) })
	// With the denial cache, every status is still Redis's own (only Cached
	// differs): a cached answer is complete and exact. Hot: requests that
	// hammer small limits one hit at a time, so that many are answered
	// from the cache.
	t.Run("deny cache", func(t *testing.T) { testDifferential(t, srv, true, false) })
	t.Run("deny cache hot", func(t *testing.T) { testDifferential(t, srv, true, true) })
}

func testDifferential(t *testing.T, srv *redistest.Server, denyCache, hot bool) {
	seed := storetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	clock := storetest.NewClock(storetest.T0)
	mem := memstore.New(memstore.Options{Now: clock.Now, SweepEvery: time.Hour}) // no sweeps: counters are forgotten when touched, as Redis forgets them
	defer mem.Close()
	red := newStore(t, Options{URL: srv.URL(), Now: clock.Now, Prefix: fmt.Sprintf("diff%d:%s:", seed, t.Name()), DenyCache: denyCache}) // a replayed seed runs every subtest with it

	windows := []time.Duration{time.Second, 2 * time.Second, time.Minute, time.Hour}
	var limits []*engine.Rule
	for _, alg := range storetest.Algorithms() {
		for _, w := range windows {
			for _, rpu := range []uint32{0, 1, 3, 10, 1000} {
				burst := uint32(0)
				if alg == engine.TokenBucket {
					burst = rpu * uint32(1+rng.IntN(3))
				}
				l := storetest.Rule(alg, rpu, w, burst)
				l.ID = storetest.WindowID(l)
				if rpu != 3 {
					// One counter per limit variant, except that the 3 and 10
					// variants share one, as an override shares the counter of
					// a configured limit.
					l.ID = fmt.Sprintf("%s:%d:%d", l.ID, rpu, burst)
				} else {
					l.ID = fmt.Sprintf("%s:%d:%d", l.ID, 10, burst)
				}
				limits = append(limits, l)
			}
		}
	}
	for _, rpu := range []uint32{1, 3, 10} {
		limits = append(limits, storetest.CalendarRule(engine.Day, rpu, time.UTC))
	}
	// Penalized copies of a quarter of them, each its own counter.
	steps := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}
	for i, l := range limits {
		if rng.IntN(4) != 0 || l.Calendar != nil {
			continue
		}
		p := *l
		p.Penalty = steps[:1+rng.IntN(len(steps))]
		p.PenaltyReset = []time.Duration{10 * time.Second, time.Minute, time.Hour}[rng.IntN(3)]
		p.ID += fmt.Sprintf(":pen%d", i)
		limits = append(limits, &p)
	}
	// Limits that reserve, each its own counter, called with ids of a
	// small pool (so that reserves meet settles, repeats and ends by
	// themselves) or none.
	reserving := reservingLimits(rng)
	limits = append(limits, reserving...)
	descs := []string{"d/a=1", "d/a=2", "d/b=1", "d/c=x"}
	if hot {
		// Limits of 0, 1 and 3 (a quarter of them shared by 3 and 10).
		small := limits[:0:0]
		for _, l := range limits {
			if l.Limit <= 3 || rng.IntN(4) == 0 {
				small = append(small, l)
			}
		}
		limits, descs = small, descs[:2]
	}
	const nsteps = 3000
	var phases [engine.SettlingUnheld + 1]int
	lapsed := 0
	for step := range nsteps {
		d := time.Duration(rng.ExpFloat64() * float64(200*time.Millisecond))
		if rng.IntN(15) == 0 {
			d = -d // the clock steps back: every store holds its counters where they were
		}
		clock.Set(clock.Now().Add(d))
		n := 1 + rng.IntN(4)
		if hot {
			n = 1 + rng.IntN(2)
		}
		items := make([]engine.Item, n)
		for i := range items {
			it := &items[i]
			it.Desc = descs[rng.IntN(len(descs))]
			it.Rule = limits[rng.IntN(len(limits))]
			it.Hits = uint64(rng.IntN(4))
			if rng.IntN(8) == 0 {
				it.Hits = uint64(rng.IntN(20))
			}
			it.Refund = rng.IntN(10) == 0
			it.Shadow = rng.IntN(10) == 0
			it.CountDenied = !it.Refund && rng.IntN(8) == 0
			if rng.IntN(6) == 0 {
				it.Group = int32(1 + rng.IntN(2))
			}
			if hot {
				it.Hits = 1 + uint64(rng.IntN(8)/7) // mostly 1, sometimes 2
				it.Refund = rng.IntN(40) == 0
				it.Shadow, it.Group = false, 0
			}
			if !hot && rng.IntN(3) == 0 {
				// One of a few counters that reserve, so that calls with one
				// id meet on it: reserves, settles, repeats.
				it.Rule, it.Desc = reserving[rng.IntN(len(reserving))%5*7], descs[rng.IntN(2)]
			}
			drawReservation(rng, it)
		}
		if rng.IntN(5) == 0 && n > 1 {
			items[n-1] = items[0] // the same counter twice
		}
		mr := make([]engine.Result, n)
		rr := make([]engine.Result, n)
		mok, err := mem.Apply(context.Background(), items, mr)
		if err != nil {
			t.Fatal(err)
		}
		rok, err := red.Apply(context.Background(), items, rr)
		if err != nil {
			t.Fatalf("step %d: redis: %v", step, err)
		}
		if mok != rok {
			t.Fatalf("step %d (seed %d) at T0+%s: memory admitted=%v, redis admitted=%v\nitems %s\nmemory %+v\nredis  %+v",
				step, seed, clock.Now().Sub(storetest.T0), mok, rok, describe(items), mr, rr)
		}
		for i := range items {
			phases[mr[i].Phase]++
			lapsed += int(mr[i].Lapsed)
			cached := rr[i].Cached
			rr[i].Cached = false
			if mr[i] != rr[i] {
				t.Fatalf("step %d (seed %d) at T0+%s item %d: memory %+v, redis %+v (cached %v)\nitems %s",
					step, seed, clock.Now().Sub(storetest.T0), i, mr[i], rr[i], cached, describe(items))
			}
		}
	}
	// The hot variant must meet the cache (hundreds of answers); the other
	// may not, by the draw (RLS_TEST_SEED=1795520413453859802: none).
	if hot && red.Stats().CacheHits == 0 {
		t.Error("the denial cache answered no request: the comparison did not cover it")
	}
	t.Logf("answered from the denial cache: %d of %d", red.Stats().CacheHits, nsteps)
	t.Logf("reservation calls by phase %v (none, reserve, settle, settled again, settle unheld); holds ended by themselves %d", phases, lapsed)
	// Reserves, settles and holds that end by themselves come in every
	// draw; a second settle and a settle of an ended hold are rarer (none
	// of the former with RLS_TEST_SEED=1795950807288617983) and pinned
	// by the stores' conformance timelines.
	if !hot && (phases[engine.Reserving] == 0 || phases[engine.Settling] == 0 || lapsed == 0) {
		t.Errorf("seed %d: the draw left reserves, settles or an ended hold out (%v, %d): it tests too little of reservations", seed, phases, lapsed)
	}
}

func describe(items []engine.Item) string {
	var b strings.Builder
	for _, it := range items {
		fmt.Fprintf(&b, "\n  %s %s %d/%s burst %d penalty %v/%s hits %d refund %v shadow %v count denied %v group %d", it.Desc, it.Rule.Algorithm(), it.Rule.Limit, it.Rule.Window, it.Rule.Burst, it.Rule.Penalty, it.Rule.PenaltyReset, it.Hits, it.Refund, it.Shadow, it.CountDenied, it.Group)
		if r := it.Rule.Reserve; r != nil {
			fmt.Fprintf(&b, " reserve %d/%s id %q", r.Estimate, r.TTL, it.Reservation)
		}
	}
	return b.String()
}

// reservingLimits returns limits that reserve, of every algorithm that can
// hold, each its own counter (its ID marked), for the differential tests.
func reservingLimits(rng *rand.Rand) []*engine.Rule {
	var out []*engine.Rule
	ttls := []time.Duration{300 * time.Millisecond, 2 * time.Second, 20 * time.Second}
	for _, alg := range []string{engine.FixedWindow, engine.SlidingWindow, engine.SlidingLog, engine.TokenBucket} {
		for _, w := range []time.Duration{time.Second, time.Minute, time.Hour} {
			for _, rpu := range []uint32{4, 10, 1000} {
				burst := uint32(0)
				if alg == engine.TokenBucket {
					burst = rpu * uint32(1+rng.IntN(2))
				}
				estimate := []uint32{1, 2, 4}[rng.IntN(3)]
				l := storetest.ReserveRule(alg, rpu, w, burst, estimate, ttls[rng.IntN(len(ttls))])
				l.ID += fmt.Sprintf(":res%d:%d", rpu, burst)
				out = append(out, l)
			}
		}
	}
	cal := engine.MustCompile(engine.Spec{Unit: engine.Day, Multiplier: 1, Limit: 20, Calendar: true,
		Reserve: engine.Some(engine.Reserve{Estimate: 3, TTL: 2 * time.Second})})
	cal.ID += ":res"
	return append(out, cal)
}

// drawReservation gives item it, when its rule reserves, an id from a
// small pool most of the time (a reservation call: a reserve, a settle,
// a repeat), and sometimes hits above the estimate (a settle beyond its
// hold).
func drawReservation(rng *rand.Rand, it *engine.Item) {
	if it.Rule.Reserve == nil || rng.IntN(4) == 0 {
		return
	}
	it.Reservation = fmt.Sprintf("r%d", rng.IntN(6))
	if rng.IntN(3) == 0 {
		it.Hits = uint64(rng.IntN(12))
	}
}

// fcallCalls returns the FCALLs the server has run.
func fcallCalls(t *testing.T, addr string) int {
	t.Helper()
	out, err := redistest.Command(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_fcall:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestOneCallPerRequest: whatever the windows and descriptors, a request
// is one FCALL.
func TestOneCallPerRequest(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL()})
	var items []engine.Item
	for d := range 3 {
		for _, l := range []*engine.Rule{
			storetest.Rule(engine.FixedWindow, 1000, time.Second, 0),
			storetest.Rule(engine.SlidingWindow, 1000, time.Minute, 0),
			storetest.Rule(engine.TokenBucket, 1000, time.Hour, 1000),
			storetest.Rule(engine.SlidingLog, 1000, time.Hour, 0),
		} {
			items = append(items, engine.Item{Desc: fmt.Sprintf("d/k=%d", d), Rule: l, Hits: 1})
		}
	}
	results := make([]engine.Result, len(items))
	s.Apply(context.Background(), items, results) // loads the library (FCALL, FUNCTION LOAD, FCALL)
	before := fcallCalls(t, srv.Addr())
	const requests = 50
	for i := range requests {
		ok, err := s.Apply(context.Background(), items, results)
		if err != nil || !ok {
			t.Fatalf("request %d with 3 descriptors × 4 windows: %v %v", i, ok, err)
		}
	}
	if got := fcallCalls(t, srv.Addr()) - before; got != requests {
		t.Errorf("INFO commandstats: %d fcall calls for %d requests of 12 limits each, want %d", got, requests, requests)
	}
}

// TestLeanPath: a plain request (one hit per item, no flags) on windows and
// buckets is decided by the lean path: one HMGET and one HSET per
// descriptor, no HGETALL; a denied one goes the general way after it, and a
// request with hits other than one goes the general way alone.
func TestLeanPath(t *testing.T) {
	srv := redistest.Start(t)
	clock := func() time.Time { return storetest.T0.Add(500 * time.Millisecond) }
	s := newStore(t, Options{URL: srv.URL(), Now: clock})
	windows := func(desc string, hits uint64) []engine.Item {
		var items []engine.Item
		for _, r := range []*engine.Rule{
			storetest.Rule(engine.FixedWindow, 3, time.Second, 0),
			storetest.Rule(engine.FixedWindow, 100, time.Minute, 0),
			storetest.Rule(engine.SlidingWindow, 100, time.Hour, 0),
			storetest.Rule(engine.TokenBucket, 100, time.Second, 100),
		} {
			items = append(items, engine.Item{Desc: desc, Rule: r, Hits: hits})
		}
		return items
	}
	three := append(append(windows("lean/a=1", 1), windows("lean/b=1", 1)...), windows("lean/c=1", 1)...)
	ctx := context.Background()
	client := s.backends[0].conn.Client()
	results := make([]engine.Result, len(three))
	s.Apply(ctx, windows("lean/warm=1", 1), results) // loads the library
	for i, step := range []struct {
		name                 string
		items                []engine.Item
		admitted             bool
		hmget, hgetall, hset float64
	}{
		{"plain, new hash", windows("lean/k=1", 1), true, 1, 0, 1},
		{"plain", windows("lean/k=1", 1), true, 1, 0, 1},
		{"plain, the last hit of the second", windows("lean/k=1", 1), true, 1, 0, 1},
		{"plain, denied: the general path after", windows("lean/k=1", 1), false, 1, 1, 0},
		{"two hits: the general path", windows("lean/k=2", 2), true, 0, 1, 1},
		{"plain, three descriptors", three, true, 3, 0, 3},
	} {
		before := commandStats(t, client)
		ok, err := s.Apply(ctx, step.items, results[:len(step.items)])
		if err != nil || ok != step.admitted {
			t.Fatalf("step %d (%s): Apply = %v, %v; want %v", i+1, step.name, ok, err, step.admitted)
		}
		after := commandStats(t, client)
		for name, want := range map[string]float64{"hmget": step.hmget, "hgetall": step.hgetall, "hset": step.hset} {
			if got := after[name].calls - before[name].calls; got != want {
				t.Errorf("step %d (%s): %s ran %v times, want %v", i+1, step.name, strings.ToUpper(name), got, want)
			}
		}
	}
}

// TestLibraryReloadedAfterFlush: a Redis that lost the function library
// (FUNCTION FLUSH, or a restart without persistence) gets it again, and the
// request that found it missing is decided once.
func TestLibraryReloadedAfterFlush(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL()})
	items := []engine.Item{{Desc: "d/k=v", Rule: storetest.Rule(engine.FixedWindow, 10, time.Hour, 0), Hits: 1}}
	results := make([]engine.Result, 1)
	for i := range 3 {
		if i == 1 {
			if _, err := redistest.Command(srv.Addr(), "FUNCTION", "FLUSH"); err != nil {
				t.Fatal(err)
			}
		}
		ok, err := s.Apply(context.Background(), items, results)
		if err != nil || !ok || results[0].Remaining != uint64(9-i) {
			t.Fatalf("request %d (functions flushed before request 1): %v %v remaining %d, want true, nil, %d", i, ok, err, results[0].Remaining, 9-i)
		}
	}
}

func TestDenyCache(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0.Add(10 * time.Second))
	s := newStore(t, Options{URL: srv.URL(), Now: clock.Now, DenyCache: true})
	l := storetest.Rule(engine.FixedWindow, 2, time.Minute, 0)
	l2 := storetest.Rule(engine.FixedWindow, 1, time.Hour, 0)
	other := storetest.Rule(engine.FixedWindow, 100, time.Minute, 0)
	items := []engine.Item{{Desc: "d/k=v", Rule: l, Hits: 1}, {Desc: "d/k=v", Rule: l2, Hits: 1}}
	results := make([]engine.Result, 3)
	apply := func(items []engine.Item) bool {
		t.Helper()
		ok, err := s.Apply(context.Background(), items, results[:len(items)])
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	apply(items[:1])
	apply(items)
	if apply(items) {
		t.Fatal("third request on a limit of 2 admitted")
	}
	trips := s.Stats().RoundTrips
	steps := []struct {
		at       time.Duration // since T0
		hits     uint64
		cached   bool
		admitted bool
	}{
		{11 * time.Second, 1, true, false},
		{59 * time.Second, 1, true, false},
		{59 * time.Second, 0, false, true}, // a look is never answered from the cache
		{60*time.Second - time.Millisecond, 5, true, false},
		{60 * time.Second, 1, false, false}, // exactly T: a real round trip; the new minute admits, the hour does not
	}
	for i, st := range steps {
		clock.Set(storetest.T0.Add(st.at))
		items[0].Hits, items[1].Hits = st.hits, st.hits
		before := s.Stats().RoundTrips
		ok := apply(items)
		cached := s.Stats().RoundTrips == before
		if ok != st.admitted || cached != st.cached || results[0].Cached != st.cached || results[1].Cached != st.cached {
			t.Fatalf("step %d at T0+%s hits %d: admitted %v, no round trip %v (Cached %v %v); want %v, %v", i, st.at, st.hits, ok, cached, results[0].Cached, results[1].Cached, st.admitted, st.cached)
		}
		if st.cached && st.hits > 2 {
			// More than the limit of 2: no wait admits them (Result.Never).
			if !results[0].Never || results[0].RetryAfter != 0 || !results[1].Never {
				t.Errorf("step %d: cached results %+v, want Never with no RetryAfter: %d hits never pass a limit of 2", i, results[:2], st.hits)
			}
		} else if st.cached && (results[0].RetryAfter != storetest.T0.Add(60*time.Second).Sub(clock.Now()) || results[1].RetryAfter != storetest.T0.Add(time.Hour).Sub(clock.Now())) {
			t.Errorf("step %d: cached results %+v, want each RetryAfter up to its window's end", i, results[:2])
		}
	}
	if s.Stats().CacheHits != 3 || s.Stats().RoundTrips-trips != 2 {
		t.Errorf("stats %+v: want 3 cache hits and 2 round trips since", s.Stats())
	}

	// A request with an item the cache does not know goes to Redis, so that
	// every status is whole: the other item's remaining, the known denial's
	// too.
	clock.Set(storetest.T0.Add(61 * time.Second))
	items[1].Hits = 1
	apply(items[1:]) // denied and cached
	withOther := []engine.Item{items[1], {Desc: "d/other=1", Rule: other, Hits: 1}}
	before := s.Stats().RoundTrips
	if apply(withOther) || s.Stats().RoundTrips == before {
		t.Fatal("a request with an unknown item was answered from the cache")
	}
	if results[0].Cached || results[0].Admitted || results[1].Cached || !results[1].Admitted || results[1].Remaining != 100 {
		t.Errorf("results %+v: want the hour denied and the other item judged by Redis (admitted, 100 left, nothing consumed)", results[:2])
	}
}

func TestDenyCacheDroppedByRefund(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{URL: srv.URL(), Now: clock.Now, DenyCache: true})
	l := storetest.Rule(engine.FixedWindow, 1, time.Minute, 0)
	results := make([]engine.Result, 1)
	hit := func(refund bool) bool {
		ok, err := s.Apply(context.Background(), []engine.Item{{Desc: "d/k=v", Rule: l, Hits: 1, Refund: refund}}, results)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	hit(false)
	if hit(false) {
		t.Fatal("second hit on a limit of 1 admitted")
	}
	hit(true) // give it back
	if !hit(false) {
		t.Error("after a refund the cached denial still answered")
	}
}

func TestRestartedRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL(), Timeout: time.Second, PoolSize: 8})
	l := storetest.Rule(engine.FixedWindow, 1_000_000, time.Hour, 0)
	apply := func(i int) error {
		_, err := s.Apply(context.Background(), []engine.Item{{Desc: fmt.Sprintf("d/k=%d", i), Rule: l, Hits: 1}}, make([]engine.Result, 1))
		return err
	}
	// Fill the pool with connections.
	errs := make(chan error, 64)
	for i := range 64 {
		go func() { errs <- apply(i) }()
	}
	for range 64 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	srv.Restart()
	failed := 0
	for i := range 64 {
		go func() { errs <- apply(i) }()
	}
	for range 64 {
		if err := <-errs; err != nil {
			failed++
			t.Logf("after restart: %v", err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of 64 requests failed after a Redis restart; want 0 (stale pooled connections are retried)", failed)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Errorf("Ping after restart: %v", err)
	}
}

func TestStoppedRedisTimesOut(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL(), Timeout: 50 * time.Millisecond})
	items := []engine.Item{{Desc: "d/k=v", Rule: storetest.Rule(engine.FixedWindow, 10, time.Hour, 0), Hits: 1}}
	results := make([]engine.Result, 1)
	if _, err := s.Apply(context.Background(), items, results); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	_, err := s.Apply(context.Background(), items, results)
	if err == nil {
		t.Fatal("Apply against a paused Redis succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Apply against a paused Redis took %s, want about the 50ms timeout", d)
	}
	if err := s.Ping(context.Background()); err == nil {
		t.Error("Ping of a paused Redis succeeded")
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{{URL: "http://x"}, {Prefix: "{x}"}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) = nil error", o)
		}
	}
}

func BenchmarkApply(b *testing.B) {
	srv := redistest.Start(b)
	for _, shape := range []struct {
		name  string
		descs int
		wins  int
	}{{"1x3", 1, 3}, {"3x2", 3, 2}} {
		b.Run(shape.name, func(b *testing.B) {
			w, _ := strconv.Atoi(os.Getenv("RLS_BENCH_WORKERS"))
			s := newStore(b, Options{URL: srv.URL(), Workers: w})
			wins := []*engine.Rule{
				storetest.Rule(engine.FixedWindow, 1<<30, time.Second, 0),
				storetest.Rule(engine.FixedWindow, 1<<30, time.Minute, 0),
				storetest.Rule(engine.SlidingWindow, 1<<30, time.Hour, 0),
			}
			var items []engine.Item
			for d := range shape.descs {
				for w := range shape.wins {
					items = append(items, engine.Item{Desc: fmt.Sprintf("bench/k=%d", d), Rule: wins[w], Hits: 1})
				}
			}
			b.ReportAllocs()
			b.SetParallelism(16) // 32 requests in flight on 2 CPUs, as under load
			before, cpu0 := s.Stats(), redisCPU(b, srv.Addr())
			b.RunParallel(func(pb *testing.PB) {
				results := make([]engine.Result, len(items))
				for pb.Next() {
					if _, err := s.Apply(context.Background(), items, results); err != nil {
						b.Error(err)
						return
					}
				}
			})
			st := s.Stats()
			if d := st.Decisions - before.Decisions; d > 0 {
				b.ReportMetric(float64(d)/float64(st.RoundTrips-before.RoundTrips), "decisions/roundtrip")
				b.ReportMetric(float64(st.Scripts-before.Scripts)/float64(d), "fcall/decision")
				b.ReportMetric((redisCPU(b, srv.Addr())-cpu0)*1e6/float64(d), "redis-cpu-µs/decision")
			}
		})
	}
}

// redisCPU returns the CPU seconds (user + system) the Redis server has
// used: the benchmark reports Redis's own cost per decision, which the
// client's ns/op hides when both share the machine's cores.
func redisCPU(tb testing.TB, addr string) float64 {
	info, err := redistest.Command(addr, "INFO", "cpu")
	if err != nil {
		tb.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("INFO cpu: %s: %v", line, err)
			}
			total += f
		}
	}
	return total
}

// TestTLSAndPassword: rediss:// with a password in the URL and a private CA.
func TestTLSAndPassword(t *testing.T) {
	files := testpki.New(t)
	srv := redistest.StartWith(t, redistest.Config{Password: "s3cret", TLS: files})
	items := []engine.Item{{Desc: "d/k=v", Rule: storetest.Rule(engine.FixedWindow, 10, time.Hour, 0), Hits: 1}}
	results := make([]engine.Result, 1)

	s := newStore(t, Options{URL: "rediss://:s3cret@" + srv.Addr() + "/0", CAFile: files.CA})
	if ok, err := s.Apply(context.Background(), items, results); err != nil || !ok {
		t.Fatalf("Apply over TLS with the password: %v %v", ok, err)
	}
	for name, opts := range map[string]Options{
		"wrong password": {URL: "rediss://:nope@" + srv.Addr() + "/0", CAFile: files.CA},
		"no TLS":         {URL: "redis://:s3cret@" + srv.Addr() + "/0"},
		"untrusted CA":   {URL: "rediss://:s3cret@" + srv.Addr() + "/0"},
	} {
		opts.Timeout = time.Second
		bad := newStore(t, opts)
		if _, err := bad.Apply(context.Background(), items, results); err == nil {
			t.Errorf("%s: Apply succeeded", name)
		}
		if err := bad.Ping(context.Background()); err == nil {
			t.Errorf("%s: Ping succeeded", name)
		}
	}
	if _, err := New(Options{URL: "redis://" + srv.Addr(), CAFile: files.CA}); err == nil {
		t.Error("a CA file with a redis:// URL was accepted")
	}
}

// TestTLSClientCertificate: a Redis that requires client certificates
// (tls-auth-clients yes) answers a store that presents one signed by its
// CA, and refuses one that presents none. A certificate without its key is
// a start-up error.
func TestTLSClientCertificate(t *testing.T) {
	files := testpki.New(t)
	srv := redistest.StartWith(t, redistest.Config{TLS: files, ClientCerts: true})
	items := []engine.Item{{Desc: "d/k=v", Rule: storetest.Rule(engine.FixedWindow, 10, time.Hour, 0), Hits: 1}}
	results := make([]engine.Result, 1)
	url := "rediss://" + srv.Addr() + "/0"
	s := newStore(t, Options{URL: url, CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key})
	if ok, err := s.Apply(context.Background(), items, results); err != nil || !ok {
		t.Fatalf("Apply with a client certificate: %v %v", ok, err)
	}
	anonymous := newStore(t, Options{URL: url, CAFile: files.CA, Timeout: time.Second})
	if err := anonymous.Ping(context.Background()); err == nil {
		t.Error("Ping without a client certificate succeeded")
	}
	if _, err := New(Options{URL: url, CAFile: files.CA, CertFile: files.Cert}); err == nil {
		t.Error("a client certificate without its key was accepted")
	}
	if _, err := New(Options{URL: "redis://" + srv.Addr(), CertFile: files.Cert, KeyFile: files.Key}); err == nil {
		t.Error("a client certificate with a redis:// URL was accepted")
	}
}

// TestHashExpiry: the hash of a descriptor's counters lives until the
// latest expiry of their states, after every write: a look opening a
// sliding window and then a hit, a window whose count equals the last
// one's (a state left with an earlier expiry made the sliding window
// forget its previous count at the next boundary), and a short window
// written after a long one (the hash keeps the long one's expiry). The
// keys of a test clock live a day longer than the state's expiry, which
// the TTLs are checked against.
func TestHashExpiry(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{URL: srv.URL(), Now: clock.Now})
	sliding := storetest.Rule(engine.SlidingWindow, 10, time.Minute, 0)
	hour := storetest.Rule(engine.FixedWindow, 10, time.Hour, 0)
	second := storetest.Rule(engine.FixedWindow, 10, time.Second, 0)
	at90 := storetest.T0.Add(90 * time.Second)
	for _, tc := range []struct {
		name  string
		first *engine.Rule // its one hit at T0
		then  []engine.Item
		// expires is when the hash's latest state stops weighing, set
		// is when that expiry was set (the test clock; Redis's own does
		// not move)
		expires, set time.Time
	}{
		{"a look opens the window, then a hit", sliding, []engine.Item{{Rule: sliding}, {Rule: sliding, Hits: 1}},
			at90.Truncate(time.Minute).Add(2 * time.Minute), at90},
		{"the same count as the window before", sliding, []engine.Item{{Rule: sliding, Hits: 1}},
			at90.Truncate(time.Minute).Add(2 * time.Minute), at90},
		{"a short window after a long one", hour, []engine.Item{{Rule: second, Hits: 1}},
			storetest.T0.Truncate(time.Hour).Add(time.Hour), storetest.T0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock.Set(storetest.T0)
			desc := "d/k=" + tc.name
			apply := func(it engine.Item) {
				t.Helper()
				it.Desc = desc
				if _, err := s.Apply(context.Background(), []engine.Item{it}, make([]engine.Result, 1)); err != nil {
					t.Fatal(err)
				}
			}
			apply(engine.Item{Rule: tc.first, Hits: 1})
			clock.Set(at90)
			for _, it := range tc.then {
				apply(it)
			}
			key := engine.DescriptorKey(s.opts.Prefix, desc)
			out, err := redistest.Command(srv.Addr(), "PTTL", key)
			if err != nil {
				t.Fatal(err)
			}
			ms, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
			if err != nil {
				t.Fatalf("PTTL %s = %q", key, out)
			}
			got := time.Duration(ms) * time.Millisecond
			if want := 24*time.Hour + tc.expires.Sub(tc.set); got < want-2*time.Second || got > want {
				t.Errorf("PTTL %s = %s, want %s (a day's pad plus the latest state's expiry, from when it was set)", key, got, want)
			}
		})
	}
}

func TestDenyCacheBounded(t *testing.T) {
	c := newDenyCache(100)
	c.setLive(true)
	l := storetest.Rule(engine.FixedWindow, 1, time.Hour, 0)
	now := storetest.T0
	for i := range 1000 {
		items := []engine.Item{{Desc: fmt.Sprint("d/k=", i), Rule: l, Hits: 1}}
		c.remember(items, []string{fmt.Sprint("base", i)}, []engine.Result{{RetryAfter: time.Hour}}, false, now, c.epoch)
	}
	if len(c.m) > 100 {
		t.Errorf("denial cache holds %d entries, bound 100", len(c.m))
	}
}

// TestMergedScripts: requests that one FCALL decides together get the
// answers they get one FCALL each, in the same order: the function decides
// them one after the other, each whole, reading and writing a hash that
// several of them share once for the call. Mixed: hits of 0 to 2, refunds
// and shadows, on 3 keys; plain (seeded): mostly one hit per item, the
// lean path's requests, on 8 keys, between requests of the general path
// on the same hashes (decide/lean.lua: a hash written at once, then read
// again; one read and staged by an earlier request).
func TestMergedScripts(t *testing.T) {
	srv := redistest.Start(t)
	t.Run("mixed", func(t *testing.T) {
		testMergedScripts(t, srv, rand.New(rand.NewPCG(1, 2)), 3, func(rng *rand.Rand, it *engine.Item) {
			it.Hits = uint64(rng.IntN(3))
			it.Refund = rng.IntN(8) == 0
			it.Shadow = rng.IntN(8) == 0
		})
	})
	t.Run("plain", func(t *testing.T) {
		seed := storetest.Seed(t)
		testMergedScripts(t, srv, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), 8, func(rng *rand.Rand, it *engine.Item) {
			it.Hits = 1
			if rng.IntN(10) == 0 {
				it.Hits = uint64(rng.IntN(3))
			}
		})
	})
}

func testMergedScripts(t *testing.T, srv *redistest.Server, rng *rand.Rand, keys int, hits func(*rand.Rand, *engine.Item)) {
	clock := func() time.Time { return storetest.T0.Add(1500 * time.Millisecond) }
	prefix := strings.ReplaceAll(t.Name(), "/", ":")
	merged := newStore(t, Options{URL: srv.URL(), Prefix: prefix + ":merged:", Now: clock})
	alone := newStore(t, Options{URL: srv.URL(), Prefix: prefix + ":alone:", Now: clock})

	limits := []*engine.Rule{
		storetest.Rule(engine.FixedWindow, 5, time.Second, 0),
		storetest.Rule(engine.FixedWindow, 9, time.Minute, 0),
		storetest.Rule(engine.SlidingWindow, 7, time.Minute, 0),
		storetest.Rule(engine.SlidingLog, 4, time.Minute, 0),
		storetest.Rule(engine.TokenBucket, 3, time.Second, 6),
	}
	type request struct {
		items []engine.Item
		bases map[*Store][]string
	}
	var reqs []request
	for range 60 {
		var r request
		for range 1 + rng.IntN(4) {
			it := engine.Item{Desc: fmt.Sprint("t/k=", rng.IntN(keys)), Rule: limits[rng.IntN(len(limits))]}
			hits(rng, &it)
			r.items = append(r.items, it)
		}
		r.bases = map[*Store][]string{}
		for _, s := range []*Store{merged, alone} {
			for i := range r.items {
				r.bases[s] = append(r.bases[s], s.base(&r.items[i]))
			}
		}
		reqs = append(reqs, r)
	}
	ctx := context.Background()
	client := merged.backends[0].conn.Client()
	if err := client.FunctionLoadReplace(ctx, lib.source).Err(); err != nil {
		t.Fatal(err)
	}
	fcall := func(s *Store, reqs []request) []any {
		t.Helper()
		args := []any{len(reqs)}
		for _, r := range reqs {
			args = newRequest(modeFinal, s.nowArg(), s.now(), r.items, r.bases[s]).appendArgs(args)
		}
		replies, err := client.FCall(ctx, lib.decide, reqs[0].bases[s][:1], args...).Slice()
		if err != nil || len(replies) != len(reqs) {
			t.Fatalf("FCALL of %d requests: %v, %d replies", len(reqs), err, len(replies))
		}
		return replies
	}
	together := fcall(merged, reqs) // all 60 in one call, one after the other
	denied := 0
	for i, r := range reqs {
		separate := fcall(alone, reqs[i:i+1])
		ra, rb := make([]engine.Result, len(r.items)), make([]engine.Result, len(r.items))
		okA, errA := decoded(together[i], newRequest(modeFinal, merged.nowArg(), merged.now(), r.items, r.bases[merged]), ra)
		okB, errB := decoded(separate[0], newRequest(modeFinal, alone.nowArg(), alone.now(), r.items, r.bases[alone]), rb)
		if errA != nil || errB != nil {
			t.Fatalf("request %d: %v / %v", i, errA, errB)
		}
		if okA != okB || !slices.Equal(ra, rb) {
			t.Errorf("request %d %+v:\nmerged %v %+v\nalone  %v %+v", i, r.items, okA, ra, okB, rb)
		}
		if !okA {
			denied++
		}
	}
	if denied == 0 || denied == len(reqs) {
		t.Errorf("%d of %d requests denied: the sequence does not exercise both answers", denied, len(reqs))
	}
}

// decoded writes the statuses of the reply v to req into results and
// returns whether it admitted the request.
func decoded(v any, req *request, results []engine.Result) (bool, error) {
	r, err := parseReply(v, len(req.items), req.holds)
	if err != nil {
		return false, err
	}
	return r.results(req, results)
}

// TestDenyCacheSeesRefundElsewhere: a refund sent to another rls process is
// announced by Redis, and the cached denial of this process is dropped.
func TestDenyCacheSeesRefundElsewhere(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	a := newStore(t, Options{URL: srv.URL(), Now: clock.Now, DenyCache: true})
	b := newStore(t, Options{URL: srv.URL(), Now: clock.Now, DenyCache: true})
	l := storetest.Rule(engine.FixedWindow, 2, time.Minute, 0)
	results := make([]engine.Result, 1)
	hit := func(s *Store, refund bool) bool {
		t.Helper()
		ok, err := s.Apply(context.Background(), []engine.Item{{Desc: "d/k=v", Rule: l, Hits: 1, Refund: refund}}, results)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	hit(a, false)
	hit(a, false)
	if hit(a, false) || hit(a, false) && !results[0].Cached {
		t.Fatal("want the third and fourth hits on a limit of 2 denied, the fourth from the cache")
	}
	hit(b, true) // b gives one back
	waitCacheEmpty(t, a, "the cached denial was not dropped within 5 s of the refund elsewhere")
	if !hit(a, false) || results[0].Cached {
		t.Error("after the refund elsewhere, the next hit was not admitted by Redis")
	}
}

// TestDenyCacheEpoch: a denial whose request was in flight when a notice
// arrived is not kept, and nothing is kept while the notices are not live.
func TestDenyCacheEpoch(t *testing.T) {
	c := newDenyCache(100)
	l := storetest.Rule(engine.FixedWindow, 1, time.Hour, 0)
	items := []engine.Item{{Desc: "d/k=v", Rule: l, Hits: 1}}
	denied := []engine.Result{{RetryAfter: time.Hour, Reset: time.Hour}}
	bases := []string{"base"}
	now := storetest.T0
	size := func() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.m) }

	_, e := c.deny(items, bases, make([]engine.Result, 1), now)
	c.remember(items, bases, denied, false, now, e)
	if size() != 0 {
		t.Fatal("kept a denial before the notices were live")
	}
	c.setLive(true)
	_, e = c.deny(items, bases, make([]engine.Result, 1), now)
	c.freed("base") // a notice for the counter while the request is in flight
	c.remember(items, bases, denied, false, now, e)
	if size() != 0 {
		t.Fatal("kept a denial answered before a notice for its counter arrived")
	}
	_, e = c.deny(items, bases, make([]engine.Result, 1), now)
	for range len(c.recent) + 1 {
		c.freed("other")
	}
	c.remember(items, bases, denied, false, now, e)
	if size() != 0 {
		t.Fatal("kept a denial while more notices arrived than the cache remembers")
	}
	_, e = c.deny(items, bases, make([]engine.Result, 1), now)
	c.freed("other") // a notice for another counter does not matter
	c.remember(items, bases, denied, false, now, e)
	if size() != 1 {
		t.Fatal("a notice for another counter kept this denial out")
	}
	c.freed("base")
	_, e = c.deny(items, bases, make([]engine.Result, 1), now)
	c.remember(items, bases, denied, false, now, e)
	if ok, _ := c.deny(items, bases, make([]engine.Result, 1), now); !ok {
		t.Fatal("a denial with no notice in between was not kept")
	}
	c.freed("base")
	if ok, _ := c.deny(items, bases, make([]engine.Result, 1), now); ok {
		t.Fatal("the announced counter still denied from the cache")
	}
	c.remember(items, bases, denied, false, now, c.epoch)
	c.setLive(false)
	if size() != 0 {
		t.Fatal("entries kept after the subscription was lost")
	}
}

// TestDenyCacheAfterRestart: when Redis restarts, the notices may have been
// missed, so the cache is emptied; it keeps denials again once the
// subscription is back.
func TestDenyCacheAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{URL: srv.URL(), Now: clock.Now, DenyCache: true, Timeout: time.Second})
	l := storetest.Rule(engine.FixedWindow, 1, time.Hour, 0)
	results := make([]engine.Result, 1)
	deniedTwice := func() {
		t.Helper()
		for i := range 3 {
			ok, err := s.Apply(context.Background(), []engine.Item{{Desc: "d/k=v", Rule: l, Hits: 1}}, results)
			if err != nil {
				t.Fatal(err)
			}
			if ok != (i == 0) || results[0].Cached != (i == 2) {
				t.Fatalf("hit %d: admitted %v cached %v; want the first admitted, the third denied from the cache", i, ok, results[0].Cached)
			}
		}
	}
	deniedTwice()
	c := cacheOf(s)
	c.mu.Lock()
	epoch := c.epoch
	c.mu.Unlock()
	srv.Restart() // an empty Redis: the counter is gone
	for i := 0; ; i++ {
		c.mu.Lock()
		back := c.live && c.epoch >= epoch+2 // lost, then confirmed again
		n := len(c.m)
		c.mu.Unlock()
		if back {
			if n != 0 {
				t.Fatalf("%d entries survived the restart", n)
			}
			break
		}
		if i == 1000 {
			t.Fatal("the subscription was not lost and confirmed again within 10 s of the restart")
		}
		time.Sleep(10 * time.Millisecond)
	}
	deniedTwice()
}

// TestNoChannelPermission: an ACL account without the freed channel (Redis
// 7's default for new users) still gets whole, all-or-nothing decisions
// with refunds; only the denial cache stays off.
func TestNoChannelPermission(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := redistest.Command(srv.Addr(), "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "resetchannels"); err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(storetest.T0)
	s, err := New(Options{URL: "redis://limiter:pw@" + srv.Addr() + "/0", Now: clock.Now, DenyCache: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	l := storetest.Rule(engine.FixedWindow, 5, time.Minute, 0)
	results := make([]engine.Result, 2)
	ctx := context.Background()
	if ok, err := s.Apply(ctx, []engine.Item{{Desc: "d/b=1", Rule: l, Hits: 2}}, results); err != nil || !ok {
		t.Fatalf("setup: %v %v", ok, err)
	}
	// Consume one of a, give one of b back: the refund publishes.
	ok, err := s.Apply(ctx, []engine.Item{{Desc: "d/a=1", Rule: l, Hits: 1}, {Desc: "d/b=1", Rule: l, Hits: 1, Refund: true}}, results)
	if err != nil || !ok || results[0].Remaining != 4 || results[1].Remaining != 4 {
		t.Fatalf("a request with a refund, without the channel's permission: %v %v %+v; want admitted, 4 and 4 left", ok, err, results)
	}
	look := []engine.Item{{Desc: "d/a=1", Rule: l}, {Desc: "d/b=1", Rule: l}}
	if ok, err := s.Apply(ctx, look, results); err != nil || !ok || results[0].Remaining != 4 || results[1].Remaining != 4 {
		t.Fatalf("after it: %v %v %+v; want 4 and 4 left (written once, whole)", ok, err, results)
	}
	time.Sleep(300 * time.Millisecond) // a subscription attempt or two
	if cacheOf(s).isLive() {
		t.Error("the subscription counts as live without the channel's permission")
	}
}

func TestToMicroKeepsMonotonic(t *testing.T) {
	now := time.Now()
	m := toMicro(now)
	if m.Nanosecond()%1000 != 0 || now.Sub(m) >= time.Microsecond || now.Sub(m) < 0 {
		t.Errorf("toMicro(%v) = %v, want it truncated to the microsecond", now, m)
	}
	if !strings.Contains(m.String(), "m=") {
		t.Errorf("toMicro dropped the monotonic reading: %v", m)
	}
}

// TestManyItems: a request of more items than the script scans for shared
// counters (it keeps a map past 16), with counters shared by several of
// its items, answers as the memory store does, request after request.
func TestManyItems(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	mem := memstore.New(memstore.Options{Now: clock.Now, SweepEvery: time.Hour})
	defer mem.Close()
	red := newStore(t, Options{URL: srv.URL(), Now: clock.Now, Prefix: "many:"})
	rules := []*engine.Rule{
		storetest.Rule(engine.FixedWindow, 50, time.Second, 0),
		storetest.Rule(engine.SlidingWindow, 80, time.Minute, 0),
		storetest.Rule(engine.TokenBucket, 10, time.Second, 40),
		storetest.Rule(engine.SlidingLog, 60, time.Minute, 0),
	}
	var items []engine.Item
	for i := range 40 { // 5 descriptors × 4 rules, each counter twice
		items = append(items, engine.Item{Desc: fmt.Sprint("d/k=", i%5), Rule: rules[(i/5)%4], Hits: uint64(1 + i%3)})
	}
	for step := range 12 {
		clock.Set(clock.Now().Add(150 * time.Millisecond))
		decideBoth(t, step, 0, clock.Now().Sub(storetest.T0), red, nil, mem, items)
	}
}

// decideBoth decides items on store (then waits for settle, its releases;
// nil for none) and on mem at the same instant, T0+at, and fails the test
// unless both answer alike, Cached aside (a cached denial is Redis's own
// answer, see TestDifferential). It returns store's verdict. RLS_DEBUG=1
// logs each step.
func decideBoth(t *testing.T, step int, seed uint64, at time.Duration, store engine.Store, settle func(), mem engine.Store, items []engine.Item) bool {
	t.Helper()
	debug := os.Getenv("RLS_DEBUG") != ""
	if debug {
		t.Logf("step %d T0+%s items %s", step, at, describe(items))
	}
	got, want := make([]engine.Result, len(items)), make([]engine.Result, len(items))
	gok, err := store.Apply(context.Background(), items, got)
	if err != nil {
		t.Fatalf("step %d (seed %d): %v", step, seed, err)
	}
	if settle != nil {
		settle()
	}
	wok, err := mem.Apply(context.Background(), items, want)
	if err != nil {
		t.Fatal(err)
	}
	if debug {
		t.Logf("  -> store %v %+v\n  memory %v %+v", gok, got, wok, want)
	}
	for i := range got {
		got[i].Cached = false
	}
	if gok != wok || !slices.Equal(got, want) {
		t.Fatalf("step %d (seed %d) at T0+%s: store %v %+v\nmemory %v %+v\nitems %s", step, seed, at, gok, got, wok, want, describe(items))
	}
	return gok
}

// TestBadURLHidesThePassword: a URL that does not parse is named in the
// error without its password (it was quoted whole, and rls prints the
// error at start).
func TestBadURLHidesThePassword(t *testing.T) {
	for _, url := range []string{"redis://:hunter2@ho st/0", "redis://user:hunter2@ho st:6379/0", "rediss://u:hunter2@[::1/0"} {
		_, err := New(Options{URL: url})
		if err == nil {
			t.Errorf("New(%q) = nil error, want a bad URL", url)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("New(%q) = %v: the password is in the error", url, err)
		}
	}
}

// TestFreedWarningSaysWhy: when the subscription to the freed notices
// fails, the warning says why: an account without the channel (ACLs), or
// a connection to Redis that failed (Redis killed), which is no matter of
// ACLs.
func TestFreedWarningSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fault      func(t *testing.T, srv *redistest.Server) (user string)
		want, nope string
	}{
		{"no channel permission", func(t *testing.T, srv *redistest.Server) string {
			if _, err := redistest.Command(srv.Addr(), "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "resetchannels"); err != nil {
				t.Fatal(err)
			}
			return "limiter:pw@"
		}, "it needs &rls:freed", "connection"},
		{"Redis killed", nil, "lost with its connection to Redis", "&rls:freed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			user := ""
			if tc.fault != nil {
				user = tc.fault(t, srv)
			}
			var logs servetest.SyncBuffer
			s, err := New(Options{URL: "redis://" + user + srv.Addr() + "/0", DenyCache: true, Timeout: time.Second,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if tc.fault == nil {
				waitLive(t, s)
				srv.Kill()
			}
			for i := 0; !strings.Contains(logs.String(), "denial cache is off"); i++ {
				if i == 500 {
					t.Fatalf("no warning within 5 s:\n%s", logs.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := logs.String(); !strings.Contains(got, tc.want) || strings.Contains(got, tc.nope) {
				t.Errorf("the warning says:\n%s\nwant %q, not %q", got, tc.want, tc.nope)
			}
		})
	}
}
