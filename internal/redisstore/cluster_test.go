package redisstore

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
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
	reserving := reservingLimits(rng)
	limits = append(limits, reserving...)
	descs := descsOnDistinctMasters(t, c, cl, limits[0], 3)
	denied := 0
	var phases [engine.SettlingUnheld + 1]int
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
			if rng.IntN(3) == 0 {
				it.Rule = reserving[rng.IntN(len(reserving))%4*9] // a few counters that reserve, so that ids meet
			}
			drawReservation(rng, it)
		}
		if !decideBoth(t, step, seed, clock.Now().Sub(storetest.T0), cl, cl.releasing.Wait, mem, items) {
			denied++
		}
		for _, it := range items {
			if it.Reserving() {
				phases[0]++
			}
		}
	}
	t.Logf("%d of %d requests denied, %d releases, %d reservation calls", denied, steps, cl.Stats().Releases, phases[0])
	if denied < steps/10 || cl.Stats().Releases == 0 {
		t.Errorf("%d denied, %d releases: the comparison did not cover released reservations", denied, cl.Stats().Releases)
	}
}

// TestClusterSlotMigration: while the slot of a descriptor migrates to
// another master (IMPORTING, MIGRATING, its keys moved one MIGRATE at a
// time, then SETSLOT NODE), requests on it are decided: on the source
// while it has their keys, on the target (ASK, then ASKING) once it has
// them all, on the target again once the slot is its (MOVED). Only a
// request whose keys are split between the two masters fails (TRYAGAIN),
// with nothing consumed. Requests of one descriptor, of two keys of it (a
// hash and a sliding log's sorted set), and of it and a descriptor of
// another slot on the same master; across the migration the counters hold
// exactly the hits admitted, and the descriptor's limit admits exactly its
// limit.
func TestClusterSlotMigration(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{ClusterSeeds: c.Seeds(), Now: clock.Now})
	const limit = 150
	fw := storetest.Rule(engine.FixedWindow, limit, time.Hour, 0)
	wide := storetest.Rule(engine.FixedWindow, 100000, time.Hour, 0)
	wide.ID += ":4:wide"
	sl := storetest.Rule(engine.SlidingLog, 10000, time.Hour, 0)
	const d1 = "mig/user=a"
	hash1 := engine.DescriptorKey(s.opts.Prefix, d1)
	log1 := s.base(&engine.Item{Desc: d1, Rule: sl})
	slot := c.KeySlot(hash1)
	source := c.Master(slot)
	// d2: another slot of the same master.
	d2 := ""
	for i := 0; d2 == "" && i < 10000; i++ {
		d := fmt.Sprintf("mig/user=b%d", i)
		if k := engine.DescriptorKey(s.opts.Prefix, d); c.KeySlot(k) != slot && c.Master(c.KeySlot(k)) == source {
			d2 = d
		}
	}
	var target *redistest.Server
	for _, n := range c.Nodes {
		if n != source {
			target = n
			break
		}
	}
	requests := []struct {
		name  string
		items []engine.Item
	}{
		{"one key", []engine.Item{{Desc: d1, Rule: fw, Hits: 1}}},
		{"hash and log", []engine.Item{{Desc: d1, Rule: fw, Hits: 1}, {Desc: d1, Rule: sl, Hits: 1}}},
		{"two slots", []engine.Item{{Desc: d1, Rule: fw, Hits: 1}, {Desc: d2, Rule: wide, Hits: 1}}},
	}
	ctx := context.Background()
	admitted := map[string]int{} // by counter
	var total int
	run := func(phase string, n int, failing ...string) (errs map[string]int) {
		t.Helper()
		errs = map[string]int{}
		// A look (Peek) at the three counters: followed as a decision is.
		look := []engine.Item{{Desc: d1, Rule: fw}, {Desc: d1, Rule: sl}, {Desc: d2, Rule: wide}}
		if _, err := s.Peek(ctx, look, make([]engine.Result, len(look))); err != nil && !slices.Contains(failing, "hash and log") {
			errs["peek"]++
			t.Logf("%s: peek: %v", phase, err)
		}
		for i := range n {
			r := requests[i%len(requests)]
			res := make([]engine.Result, len(r.items))
			ok, err := s.Apply(ctx, r.items, res)
			switch {
			case err != nil:
				errs[r.name]++
				if errs[r.name] == 1 {
					t.Logf("%s: %s: %v", phase, r.name, err)
				}
			case ok:
				total++
				for _, it := range r.items {
					admitted[s.base(&it)]++
				}
			}
		}
		t.Logf("%s: errors %v", phase, errs)
		return errs
	}
	want := func(phase string, errs map[string]int, failing ...string) {
		t.Helper()
		for name, n := range errs {
			if n > 0 && !slices.Contains(failing, name) {
				t.Errorf("%s: %d requests %q failed, want none", phase, n, name)
			}
		}
	}
	want("stable", run("stable", 30))
	m := c.StartMigration(slot, target)
	want("migrating, no key moved", run("migrating, no key moved", 30))
	m.Move(log1)
	// Of the requests of the hash and the log, split between the masters,
	// Redis lets none run (TRYAGAIN): they fail, having consumed nothing.
	want("the log moved", run("the log moved", 30, "hash and log"), "hash and log")
	m.Move(hash1)
	want("every key moved", run("every key moved", 30))
	m.Finish()
	want("slot given to the target", run("slot given to the target", 30))
	// Until the limit is spent: then denied.
	for range limit {
		if admitted[s.base(&engine.Item{Desc: d1, Rule: fw})] >= limit {
			break
		}
		run("after", 3)
	}
	if got := admitted[s.base(&engine.Item{Desc: d1, Rule: fw})]; got != limit {
		t.Errorf("admitted %d requests of a limit of %d", got, limit)
	}
	// Every counter holds exactly what was admitted, on the target.
	look := []engine.Item{{Desc: d1, Rule: fw}, {Desc: d1, Rule: sl}, {Desc: d2, Rule: wide}}
	res := make([]engine.Result, len(look))
	if _, err := s.Apply(ctx, look, res); err != nil {
		t.Fatal(err)
	}
	for i, it := range look {
		if used := int(it.Rule.Limit - uint32(res[i].Remaining)); used != admitted[s.base(&it)] {
			t.Errorf("%s: %d hits counted, %d admitted", s.base(&it), used, admitted[s.base(&it)])
		}
	}
	if n, err := target.Do("EXISTS", hash1, log1); err != nil || n != "2" {
		t.Errorf("EXISTS %s %s on the target: %q %v, want 2", hash1, log1, n, err)
	}
	if st := s.Stats(); st.Indeterminate != 0 {
		t.Errorf("Stats() = %+v, want nothing indeterminate", st)
	}
}

// TestKeySlot: the slots of keys as Redis's CLUSTER KEYSLOT gives them
// (read from redis-server 7.0), hash tags included.
func TestKeySlot(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"123456789", 12739},
		{"somekey", 11058},
		{"foo", 12182},
		{"bar", 5061},
		{"hello", 866},
		{"{user1000}.following", 3443},
		{"foo{}{bar}", 8363},    // an empty tag: the whole key
		{"foo{{bar}}zap", 4015}, // the tag is "{bar"
		{"foo{bar}{zap}", 5061}, // the first tag: "bar"
		{"rls:{api/remote_address=203.0.113.7}", 15970},
		{"{}", 15257},
		{"", 0},
	} {
		if got := keySlot(tc.key); got != tc.want {
			t.Errorf("keySlot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
}

// TestRouteKeysAreTheKeysTouched: the keys that a request declares in a
// cluster (request.route) are exactly the keys that the decide function
// touches for it, every algorithm, with and without a penalty, admitted
// and denied: what Redis shows in MONITOR of the commands the function
// runs.
func TestRouteKeysAreTheKeysTouched(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{URL: srv.URL(), Now: clock.Now})
	mon, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	fmt.Fprintf(mon, "MONITOR\r\n")
	lines := bufio.NewReader(mon)
	if l, err := lines.ReadString('\n'); err != nil || !strings.HasPrefix(l, "+OK") {
		t.Fatalf("MONITOR: %q %v", l, err)
	}
	var rules []*engine.Rule
	for _, alg := range storetest.Algorithms() {
		burst := uint32(0)
		if alg == engine.TokenBucket {
			burst = 1
		}
		rules = append(rules, storetest.Rule(alg, 1, time.Minute, burst))
		if alg != engine.Concurrency {
			rules = append(rules, storetest.PenaltyRule(alg, 1, time.Minute, []time.Duration{time.Minute}, time.Hour))
			rules = append(rules, storetest.ReserveRule(alg, 1, time.Minute, burst, 1, time.Minute))
		}
	}
	ctx := context.Background()
	for i, r := range rules {
		items := []engine.Item{{Desc: fmt.Sprintf("route/n=%d", i), Rule: r, Hits: 1}}
		if r.Reserve != nil {
			items[0].Reservation = "r"
		}
		req := newRequest(modeFinal, "", clock.Now(), items, []string{s.base(&items[0])})
		want, oneSlot := req.route(true)
		if !oneSlot {
			t.Fatalf("%s: one descriptor's keys in several slots", r.ID)
		}
		slices.Sort(want)
		for step, wantOK := range []bool{true, false} { // admitted, then denied (a penalty's strike, a second reserve)
			if r.Reserve != nil && step == 1 {
				items[0].Reservation = "another"
			}
			res := make([]engine.Result, 1)
			if ok, err := s.Apply(ctx, items, res); err != nil || ok != wantOK {
				t.Fatalf("%s step %d: %v %v, want %v", r.ID, step, ok, err, wantOK)
			}
			// The commands the function ran, up to a PING of ours.
			if _, err := redistest.Command(srv.Addr(), "PING", "route-mark"); err != nil {
				t.Fatal(err)
			}
			var got []string
			for {
				l, err := lines.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(l, `"route-mark"`) {
					break
				}
				f := strings.Fields(l)
				if len(f) < 5 || f[2] != "lua]" {
					continue // not run by the function
				}
				switch cmd := strings.Trim(f[3], `"`); cmd {
				case "TIME", "PUBLISH":
				default:
					if k := strings.Trim(f[4], `"`); !slices.Contains(got, k) {
						got = append(got, k)
					}
				}
			}
			slices.Sort(got)
			// A denied reserve reads a record, and writes no event: it
			// touches fewer keys than declared (the same slot).
			if !slices.Equal(got, want) && !(r.Reserve != nil && step == 1 && isSubset(got, want)) {
				t.Errorf("%s step %d: the function touched %q, the request declares %q", r.ID, step, got, want)
			}
		}
	}
}

// isSubset reports whether every element of a is in b.
func isSubset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}
