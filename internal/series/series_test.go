package series

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// fixture is a family of two counters, hits_total{domain,limit,result}
// curried to result ok and over, and waits_total{domain,limit}, in a
// registry of its own.
type fixture struct {
	f   *Family
	reg *prometheus.Registry
}

func newFixture(t *testing.T, o Options) *fixture {
	t.Helper()
	hits := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hits_total", Help: "h"}, []string{"domain", "limit", "result"})
	waits := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "waits_total", Help: "w"}, []string{"domain", "limit"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(hits, waits)
	o.Labels = []string{"domain", "limit"}
	o.Counters = []*prometheus.CounterVec{
		hits.MustCurryWith(prometheus.Labels{"result": "ok"}),
		hits.MustCurryWith(prometheus.Labels{"result": "over"}),
		waits,
	}
	return &fixture{f: New(o), reg: reg}
}

// exported returns every series of the registry as
// "name{label=value,…} count", sorted.
func (fx *fixture) exported(t *testing.T) []string {
	t.Helper()
	mfs, err := fx.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			out = append(out, fmt.Sprintf("%s{%s} %g", mf.GetName(), strings.Join(labels, ","), m.GetCounter().GetValue()))
		}
	}
	sort.Strings(out)
	return out
}

func (fx *fixture) expect(t *testing.T, step string, want ...string) {
	t.Helper()
	sort.Strings(want)
	if got := fx.exported(t); !slices.Equal(got, want) {
		t.Errorf("%s: exported\n\t%s\nwant\n\t%s", step, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// loadOne reloads fx's family with a config of one series, of labels, and
// one group, of prefix "d", and returns them.
func (fx *fixture) loadOne(labels ...string) (*Series, *Group) {
	r := fx.f.Reload()
	defer r.Commit()
	return r.Series(labels...), r.Group("", "d")
}

func tail(values ...string) []byte {
	var k []byte
	for _, v := range values {
		k = AppendLabel(k, v)
	}
	return k
}

// A declared series is made in the vectors on first use, one counter at
// a time; with Together, all of them at once.
func TestMadeOnFirstUse(t *testing.T) {
	fx := newFixture(t, Options{})
	r := fx.f.Reload()
	a := r.Series("d", "a")
	r.Series("d", "b")
	r.Commit()
	fx.expect(t, "declared, unused")
	if a.Made() {
		t.Errorf("a declared series that never counted: Made() = true, want false")
	}
	a.Counter(1).Inc()
	a.Counter(1).Add(2)
	fx.expect(t, "a counted over 3 times", `hits_total{domain=d,limit=a,result=over} 3`)
	if !a.Made() {
		t.Errorf("a series that counted: Made() = false, want true")
	}

	fx = newFixture(t, Options{Together: true})
	r = fx.f.Reload()
	a = r.Series("d", "a")
	r.Commit()
	a.Counter(2).Inc()
	fx.expect(t, "Together: a waited once",
		`hits_total{domain=d,limit=a,result=ok} 0`, `hits_total{domain=d,limit=a,result=over} 0`, `waits_total{domain=d,limit=a} 1`)
}

// A reload keeps the series it declares again (the same counters: the
// counts go on) and deletes the others.
func TestReloadKeepsAndDeletes(t *testing.T) {
	fx := newFixture(t, Options{})
	r := fx.f.Reload()
	kept, dropped := r.Series("d", "kept"), r.Series("d", "dropped")
	r.Commit()
	kept.Counter(0).Inc()
	dropped.Counter(0).Inc()
	dropped.Counter(2).Inc()

	r = fx.f.Reload()
	again := r.Series("d", "kept")
	fresh := r.Series("d", "new")
	r.Commit()
	if again != kept {
		t.Errorf("a reload declaring d/kept again gave another series: its count would restart")
	}
	again.Counter(0).Inc()
	fresh.Counter(1).Inc()
	fx.expect(t, "after the reload", `hits_total{domain=d,limit=kept,result=ok} 2`, `hits_total{domain=d,limit=new,result=over} 1`)

	// Declared again after its deletion, a series starts from nothing.
	r = fx.f.Reload()
	back := r.Series("d", "dropped")
	r.Commit()
	back.Counter(0).Inc()
	fx.expect(t, "d/dropped declared again", `hits_total{domain=d,limit=dropped,result=ok} 1`)
}

// TestLateCountMakesNoDeletedSeries: counting on the series and groups of
// a config that a reload replaced makes nothing again, whether the
// counter existed before the reload or not.
func TestLateCountMakesNoDeletedSeries(t *testing.T) {
	fx := newFixture(t, Options{Max: 2, Overflow: []string{Other}})
	old, g := fx.loadOne("d", "old")
	old.Counter(0).Inc()
	g.Get(tail("v1")).Counter(0).Inc()

	r := fx.f.Reload()
	r.Series("d", "new")
	r.Commit()
	fx.expect(t, "after the reload")
	old.Counter(0).Inc() // made before
	old.Counter(1).Inc() // never made
	old.Counter(2).Inc()
	g.Get(tail("v1")).Counter(0).Inc() // was in the group
	g.Get(tail("v2")).Counter(1).Inc() // new to it
	// The race: Get found the group live, the reload committed, then Get
	// goes on to add the tail.
	g.add(tail("v3")).Counter(0).Inc()
	fx.expect(t, "late counts on the old config")
}

// A group holds at most Max tails, then counts in its overflow series,
// which the groups of one prefix share and which lives as long as one of
// them; a reload that keeps a group keeps its series.
func TestGroupBounded(t *testing.T) {
	fx := newFixture(t, Options{Max: 2, Overflow: []string{Other}})
	r := fx.f.Reload()
	g1, g2 := r.Group("1", "d"), r.Group("2", "d")
	r.Commit()
	for _, v := range []string{"a", "b", "c", "a", "d"} {
		g1.Get(tail(v)).Counter(0).Inc()
	}
	g2.Get(tail("e")).Counter(0).Inc()
	g2.Get(tail("f")).Counter(0).Inc()
	g2.Get(tail("a")).Counter(0).Inc() // g1's series too, but new to g2: over its bound
	want := []string{`hits_total{domain=d,limit=a,result=ok} 2`, `hits_total{domain=d,limit=b,result=ok} 1`,
		`hits_total{domain=d,limit=e,result=ok} 1`, `hits_total{domain=d,limit=f,result=ok} 1`,
		`hits_total{domain=d,limit=_other,result=ok} 3`}
	fx.expect(t, "g1 over a,b,c,a,d, g2 over e,f,a, Max 2", want...)

	r = fx.f.Reload()
	if r.Group("2", "d") != g2 {
		t.Errorf("a reload declaring group d/2 again gave another group")
	}
	r.Commit()
	fx.expect(t, "g1 dropped", `hits_total{domain=d,limit=e,result=ok} 1`, `hits_total{domain=d,limit=f,result=ok} 1`,
		`hits_total{domain=d,limit=_other,result=ok} 3`)
	g2.Get(tail("g")).Counter(0).Inc()
	fx.expect(t, "g2 still full", `hits_total{domain=d,limit=e,result=ok} 1`, `hits_total{domain=d,limit=f,result=ok} 1`,
		`hits_total{domain=d,limit=_other,result=ok} 4`)

	r = fx.f.Reload()
	r.Commit()
	fx.expect(t, "no group left")
}

// One set of label values is one series, whoever reaches it: declared
// twice, or a group's tail; it is deleted only when nothing holds it.
func TestSharedLabels(t *testing.T) {
	fx := newFixture(t, Options{Max: 5, Overflow: []string{Other}})
	r := fx.f.Reload()
	s1, s2 := r.Series("d", "x"), r.Series("d", "x")
	g := r.Group("", "d")
	r.Commit()
	if s1 != s2 || g.Get(tail("x")) != s1 {
		t.Fatalf("d/x declared twice and reached through a group: not one series")
	}
	s1.Counter(0).Inc()
	r = fx.f.Reload()
	g = r.Group("", "d") // holds d/x, no longer declared on its own
	r.Commit()
	g.Get(tail("x")).Counter(0).Inc()
	fx.expect(t, "d/x held by the group only", `hits_total{domain=d,limit=x,result=ok} 2`)
	r = fx.f.Reload()
	r.Series("d", "x") // declared, but the group goes: a new group would not know x
	r.Commit()
	s1.Counter(0).Inc()
	fx.expect(t, "d/x declared again, group dropped", `hits_total{domain=d,limit=x,result=ok} 3`)
}

// A permanent series survives every reload.
func TestPermanent(t *testing.T) {
	fx := newFixture(t, Options{})
	p := fx.f.Permanent("_unknown", "")
	p.Counter(0).Inc()
	for range 2 {
		r := fx.f.Reload()
		if got := r.Series("_unknown", ""); got != p {
			t.Errorf("the permanent series declared in a reload: another series")
		}
		r.Commit()
		fx.f.Reload().Commit()
	}
	p.Counter(0).Inc()
	fx.expect(t, "after reloads", `hits_total{domain=_unknown,limit=,result=ok} 2`)
}

// Label values that are not valid UTF-8 are made valid, not refused with
// a panic as Prometheus refuses them.
func TestInvalidUTF8Labels(t *testing.T) {
	fx := newFixture(t, Options{Max: 5, Overflow: []string{Other}})
	s, g := fx.loadOne("d\xff", "a")
	s.Counter(0).Inc()
	g.Get(tail("v\xfe\xff")).Counter(0).Inc()
	fx.expect(t, "invalid bytes", "hits_total{domain=d\uFFFD,limit=a,result=ok} 1", "hits_total{domain=d,limit=v\uFFFD,result=ok} 1")
}

// Keys of different label values differ, whatever bytes the values hold,
// and decode to their values.
func TestKeys(t *testing.T) {
	lists := [][]string{{}, {""}, {"", ""}, {"a"}, {"a", ""}, {"", "a"}, {"ab"}, {"a", "b"},
		{"a\x00\x00\x00\x00", "b"}, {"a", "\x01\x00\x00\x00b"}, {"a\x01\x00\x00\x00"}, {strings.Repeat("x", 300)}}
	seen := map[string][]string{}
	for _, l := range lists {
		key := string(appendKey(nil, l))
		if other, ok := seen[key]; ok {
			t.Errorf("%q and %q have one key %q", l, other, key)
		}
		seen[key] = l
		got, err := decode(nil, key)
		if err != nil || !slices.Equal(got, l) {
			t.Errorf("decode(encode(%q)) = %q, %v", l, got, err)
		}
		// A value made of parts ends as one appended whole.
		var parts []byte
		for _, v := range l {
			start := len(parts)
			for i := range len(v) {
				parts = append(parts, v[i])
			}
			parts = EndLabel(parts, start)
		}
		if string(parts) != key {
			t.Errorf("EndLabel keys of %q: %q, want %q", l, parts, key)
		}
	}
	for _, bad := range []string{"\x01", "ab\x05\x00\x00\x00"} {
		if l, err := decode(nil, bad); err == nil {
			t.Errorf("decode(%q) = %q, want an error", bad, l)
		}
	}
}

// Counting on a made series, finding a group's series and a full group's
// overflow allocate nothing.
func TestHotPathAllocatesNothing(t *testing.T) {
	fx := newFixture(t, Options{Max: 1, Overflow: []string{Other}})
	s, g := fx.loadOne("d", "a")
	have, over := tail("v"), tail("w")
	count := func() {
		s.Counter(0).Inc()
		g.Get(have).Counter(1).Inc()
		g.Get(over).Counter(1).Inc()
	}
	count()
	if n := testing.AllocsPerRun(100, count); n != 0 {
		t.Errorf("counting on made series: %v allocations, want 0", n)
	}
}

// Requests counting on the series of whichever config they started on,
// while reloads swap configs, never leave a series that the last config
// does not have (run with -race).
func TestConcurrentLateCounts(t *testing.T) {
	fx := newFixture(t, Options{Max: 3, Overflow: []string{Other}})
	type config struct {
		series []*Series
		groups []*Group
	}
	load := func(round int) *config {
		r := fx.f.Reload()
		defer r.Commit()
		c := &config{}
		for i := range 4 {
			c.series = append(c.series, r.Series("d", fmt.Sprint("r", round+i)))
			c.groups = append(c.groups, r.Group("", fmt.Sprint("g", round+i)))
		}
		return c
	}
	var (
		mu  sync.Mutex
		cur = load(0)
		wg  sync.WaitGroup
	)
	const rounds = 200
	for w := range 4 {
		wg.Go(func() {
			for i := range rounds * 20 {
				mu.Lock()
				c := cur
				mu.Unlock()
				c.series[i%4].Counter((i + w) % 3).Inc()
				c.groups[(i+w)%4].Get(tail(fmt.Sprint("v", i%5))).Counter(i % 3).Inc()
			}
		})
	}
	for round := 1; round <= rounds; round++ {
		c := load(round)
		mu.Lock()
		cur = c
		mu.Unlock()
	}
	wg.Wait()
	last := fmt.Sprint(rounds)
	for _, s := range fx.exported(t) {
		// Round 200's config: r200..r203 and the groups g200..g203.
		ok := false
		for i := range 4 {
			n := fmt.Sprint(rounds + i)
			ok = ok || strings.Contains(s, "domain=d,limit=r"+n+",") || strings.Contains(s, "domain=d,limit=r"+n+"}") || strings.Contains(s, "domain=g"+n+",")
		}
		if !ok {
			t.Errorf("series %s exported, but the last config (round %s) does not have it", s, last)
		}
	}
}

// BenchmarkCount is one count on a made series, one on a group's series
// and one on a full group's overflow: what a request costs once its
// series exist.
func BenchmarkCount(b *testing.B) {
	hits := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hits_total", Help: "h"}, []string{"domain", "limit"})
	f := New(Options{Labels: []string{"domain", "limit"}, Counters: []*prometheus.CounterVec{hits}, Max: 1, Overflow: []string{Other}})
	r := f.Reload()
	s, g := r.Series("d", "a"), r.Group("", "d")
	r.Commit()
	have, over := tail("v"), tail("w")
	b.ReportAllocs()
	for b.Loop() {
		s.Counter(0).Inc()
		g.Get(have).Counter(0).Inc()
		g.Get(over).Counter(0).Inc()
	}
}
