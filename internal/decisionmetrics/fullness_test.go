package decisionmetrics

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rlsproject/rls/internal/engine/storetest"
)

func TestLevelOf(t *testing.T) {
	for _, tc := range []struct {
		remaining, capacity uint64
		want                fullLevel
	}{
		{10, 10, belowHalf},
		{6, 10, belowHalf}, // 40 %
		{5, 10, halfFull},  // 50 %
		{3, 10, halfFull},  // 70 %
		{2, 10, mostlyFull},
		{1, 10, mostlyFull},
		{0, 10, full},
		{0, 0, belowHalf}, // a limit of 0 admits nothing by design
		{11, 10, belowHalf},
		{1, 1, belowHalf},
		{0, 1, full},
		{1, 2, halfFull},
		{1, 3, halfFull},   // 2/3 spent
		{2, 3, belowHalf},  // 1/3
		{1, 5, mostlyFull}, // exactly 80 %
		{2, 5, halfFull},   // 60 %
		{1, 9, mostlyFull}, // 8/9
		{2, 9, halfFull},   // 7/9 < 80 %
		{5, 9, belowHalf},  // 4/9
		{4, 9, halfFull},   // 5/9
		{1, 1 << 63, mostlyFull},
		{1<<63 + 1, 1 << 63, belowHalf},
		{1 << 62, 1 << 63, halfFull},
		{math64, math64, belowHalf},
		{math64 / 5, math64, mostlyFull},
	} {
		if got := levelOf(tc.remaining, tc.capacity); got != tc.want {
			t.Errorf("levelOf(remaining %d, capacity %d) = %d, want %d", tc.remaining, tc.capacity, got, tc.want)
		}
	}
}

const math64 = ^uint64(0)

// sampleFixture is a fullness with bounds of its own, on a clock, and its
// samples, registered in a registry of their own.
type sampleFixture struct {
	f       *fullness
	clock   *storetest.Clock
	reg     *prometheus.Registry
	samples map[string]*keySample
}

func newSampleFixture(t *testing.T, perLimit, total int) *sampleFixture {
	t.Helper()
	fx := &sampleFixture{clock: storetest.NewClock(storetest.T0), reg: prometheus.NewPedanticRegistry(), samples: map[string]*keySample{}}
	fx.f = newFullness(perLimit, total, fx.clock.Now)
	fx.reg.MustRegister(fx.f)
	return fx
}

// sample returns limit's sample (of domain "d").
func (fx *sampleFixture) sample(limit string) *keySample {
	if ks := fx.samples[limit]; ks != nil {
		return ks
	}
	var slot atomic.Pointer[keySample]
	ks := fx.f.sampleFor(&slot, fx.f.gen, sampleID{"d", limit}, 10)
	fx.samples[limit] = ks
	return ks
}

// observe records key of limit at level lv until in from now.
func (fx *sampleFixture) observe(limit, key string, lv fullLevel, in time.Duration) {
	now := fx.clock.Now()
	fx.sample(limit).observe(key, lv, now.UnixNano(), now.Add(in).UnixNano())
}

// gauges returns the fullness series as "limit above=value", sorted.
func (fx *sampleFixture) gauges(t *testing.T) []string {
	t.Helper()
	return fullnessSeries(t, fx.reg)
}

// fullnessSeries returns the rls_limit_keys_fullness series of reg as
// "domain/limit above=value", sorted.
func fullnessSeries(t *testing.T, reg prometheus.Gatherer) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "rls_limit_keys_fullness" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out = append(out, fmt.Sprintf("%s/%s %s=%g", l["domain"], l["limit"], l["above"], m.GetGauge().GetValue()))
		}
	}
	sort.Strings(out)
	return out
}

// series spells the three series of domain/limit with their values.
func series3(limit string, half, most, all int) []string {
	return []string{
		fmt.Sprintf("%s 0.5=%d", limit, half),
		fmt.Sprintf("%s 0.8=%d", limit, most),
		fmt.Sprintf("%s 1=%d", limit, all),
	}
}

func want(groups ...[]string) []string {
	out := slices.Concat(groups...)
	sort.Strings(out)
	return out
}

// keys returns the keys of limit's sample, sorted.
func (fx *sampleFixture) keys(limit string) []string {
	ks := fx.sample(limit)
	ks.mu.Lock()
	defer ks.mu.Unlock()
	var out []string
	for _, e := range ks.entries {
		out = append(out, e.key)
	}
	sort.Strings(out)
	return out
}

// checkInvariants: the index and the entries agree, and the sizes add up.
func (fx *sampleFixture) checkInvariants(t *testing.T, step string) {
	t.Helper()
	total := 0
	for limit, ks := range fx.samples {
		ks.mu.Lock()
		if len(ks.index) != len(ks.entries) || int(ks.n.Load()) != len(ks.entries) {
			t.Errorf("%s: sample %s: %d indexed, %d entries, n %d", step, limit, len(ks.index), len(ks.entries), ks.n.Load())
		}
		for i, e := range ks.entries {
			if j, ok := ks.index[e.key]; !ok || int(j) != i {
				t.Errorf("%s: sample %s: entry %d (%s) indexed at %d, %v", step, limit, i, e.key, j, ok)
			}
			if e.until < ks.soonest {
				t.Errorf("%s: sample %s: entry %s expires at %d, before soonest %d", step, limit, e.key, e.until, ks.soonest)
			}
		}
		if len(ks.entries) > fx.f.perLimit {
			t.Errorf("%s: sample %s: %d entries, bound %d", step, limit, len(ks.entries), fx.f.perLimit)
		}
		total += len(ks.entries)
		ks.mu.Unlock()
	}
	if got := fx.f.size.Load(); got != int64(total) || got > fx.f.total {
		t.Errorf("%s: size %d, entries %d in all, bound %d", step, got, total, fx.f.total)
	}
}

// A key's life in the sample: in when half full, updated in place, out
// when below half again, and out when its window resets.
func TestSampleTimeline(t *testing.T) {
	fx := newSampleFixture(t, 10, 100)
	steps := []struct {
		name string
		do   func()
		want []string
	}{
		{"nothing sampled yet", func() {}, nil},
		{"k1 at 40 %: not sampled, the sample is made", func() { fx.observe("a", "k1", belowHalf, time.Minute) }, series3("d/a", 0, 0, 0)},
		{"k1 at 50 %", func() { fx.observe("a", "k1", halfFull, time.Minute) }, series3("d/a", 1, 0, 0)},
		{"k2 full until +30s", func() { fx.observe("a", "k2", full, 30*time.Second) }, series3("d/a", 2, 1, 1)},
		{"k1 at 80 %, in place", func() { fx.observe("a", "k1", mostlyFull, time.Minute) }, series3("d/a", 2, 2, 1)},
		{"k2 refunded below half: out", func() { fx.observe("a", "k2", belowHalf, 30*time.Second) }, series3("d/a", 1, 1, 0)},
		{"k3 full until +30s, of another limit", func() { fx.observe("b", "k3", full, 30*time.Second) }, want(series3("d/a", 1, 1, 0), series3("d/b", 1, 1, 1))},
		{"a reset of 0: not sampled", func() { fx.observe("b", "k4", full, 0) }, want(series3("d/a", 1, 1, 0), series3("d/b", 1, 1, 1))},
		{"+30s: k3's window resets", func() { fx.clock.Set(storetest.T0.Add(30 * time.Second)) }, want(series3("d/a", 1, 1, 0), series3("d/b", 0, 0, 0))},
		{"+59s", func() { fx.clock.Set(storetest.T0.Add(59 * time.Second)) }, want(series3("d/a", 1, 1, 0), series3("d/b", 0, 0, 0))},
		{"+60s: k1's resets", func() { fx.clock.Set(storetest.T0.Add(time.Minute)) }, want(series3("d/a", 0, 0, 0), series3("d/b", 0, 0, 0))},
	}
	for i, st := range steps {
		st.do()
		if got := fx.gauges(t); !slices.Equal(got, st.want) {
			t.Errorf("step %d (%s): rls_limit_keys_fullness\n got %v\nwant %v", i, st.name, got, st.want)
		}
		fx.checkInvariants(t, fmt.Sprintf("step %d (%s)", i, st.name))
	}
	if n := testutil.ToFloat64(fx.f.dropped); n != 0 {
		t.Errorf("dropped %v, want 0", n)
	}
}

// A full sample takes a new key in place of the expired entries first,
// then of the least full and, among those, the soonest to reset; a key
// less full than every entry is dropped. Each displaced or dropped key is
// counted.
func TestSampleEviction(t *testing.T) {
	fx := newSampleFixture(t, 4, 100)
	s := time.Second
	type obs struct {
		key string
		lv  fullLevel
		in  time.Duration
	}
	steps := []struct {
		name    string
		at      time.Duration // since T0
		obs     []obs
		keys    []string
		dropped float64
	}{
		{"fill", 0, []obs{{"k1", halfFull, 10 * s}, {"k2", halfFull, 20 * s}, {"k3", mostlyFull, 5 * s}, {"k4", full, 40 * s}},
			[]string{"k1", "k2", "k3", "k4"}, 0},
		{"a half-full key displaces the half-full one that resets soonest", 0, []obs{{"k5", halfFull, 30 * s}},
			[]string{"k2", "k3", "k4", "k5"}, 1},
		{"and the next", 0, []obs{{"k6", halfFull, 30 * s}},
			[]string{"k3", "k4", "k5", "k6"}, 2},
		{"an update takes no place", 0, []obs{{"k6", full, 50 * s}},
			[]string{"k3", "k4", "k5", "k6"}, 2},
		{"a full key displaces the least full first", 0, []obs{{"k7", full, 60 * s}},
			[]string{"k3", "k4", "k6", "k7"}, 3},
		{"+5s: k3 expired, taken out first, nothing displaced", 5 * s, []obs{{"k8", halfFull, 60 * s}},
			[]string{"k4", "k6", "k7", "k8"}, 3},
		{"a half-full key displaces the half-full one", 5 * s, []obs{{"k9", halfFull, 60 * s}},
			[]string{"k4", "k6", "k7", "k9"}, 4},
		{"an 80 % key displaces the half-full one", 5 * s, []obs{{"k10", mostlyFull, 60 * s}},
			[]string{"k10", "k4", "k6", "k7"}, 5},
		{"a half-full key among fuller ones is dropped", 5 * s, []obs{{"k11", halfFull, 60 * s}},
			[]string{"k10", "k4", "k6", "k7"}, 6},
		{"and again, without a scan (floor)", 5 * s, []obs{{"k12", halfFull, 60 * s}},
			[]string{"k10", "k4", "k6", "k7"}, 7},
		{"a full key displaces the 80 % one", 5 * s, []obs{{"k13", full, 60 * s}},
			[]string{"k13", "k4", "k6", "k7"}, 8},
		{"all full: the one resetting soonest goes (k4, +40s)", 5 * s, []obs{{"k14", full, 60 * s}},
			[]string{"k13", "k14", "k6", "k7"}, 9},
		{"+50s: k6 expired", 50 * s, []obs{{"k15", halfFull, 60 * s}},
			[]string{"k13", "k14", "k15", "k7"}, 9},
	}
	for i, st := range steps {
		fx.clock.Set(storetest.T0.Add(st.at))
		for _, o := range st.obs {
			fx.observe("a", o.key, o.lv, o.in)
		}
		name := fmt.Sprintf("step %d (%s)", i, st.name)
		if got := fx.keys("a"); !slices.Equal(got, st.keys) {
			t.Errorf("%s: keys %v, want %v", name, got, st.keys)
		}
		if got := testutil.ToFloat64(fx.f.dropped); got != st.dropped {
			t.Errorf("%s: rls_limit_keys_fullness_dropped_total %v, want %v", name, got, st.dropped)
		}
		fx.checkInvariants(t, name)
	}
}

// The bound on all samples: once it is reached a limit's new key takes the
// place of its own entries only, and a limit without entries gets none
// until places free up.
func TestSampleTotalBound(t *testing.T) {
	fx := newSampleFixture(t, 4, 6)
	for i := range 4 {
		fx.observe("a", fmt.Sprint("a", i), full, time.Minute)
	}
	fx.observe("b", "b0", halfFull, time.Minute)
	fx.observe("b", "b1", halfFull, 2*time.Minute)
	fx.checkInvariants(t, "filled")
	fx.observe("c", "c0", full, time.Minute)
	if got := fx.keys("c"); len(got) != 0 {
		t.Errorf("all 6 places taken: limit c got %v, want nothing", got)
	}
	fx.observe("b", "b2", halfFull, time.Minute)
	if got, want := fx.keys("b"), []string{"b1", "b2"}; !slices.Equal(got, want) {
		t.Errorf("all 6 places taken: limit b has %v, want %v (b0 displaced)", got, want)
	}
	if got := testutil.ToFloat64(fx.f.dropped); got != 2 {
		t.Errorf("dropped %v, want 2 (c0, b0)", got)
	}
	fx.checkInvariants(t, "over the total")
	fx.clock.Set(storetest.T0.Add(time.Minute))
	fx.gauges(t) // a scrape forgets what expired
	fx.observe("c", "c1", full, time.Minute)
	if got := fx.keys("c"); !slices.Equal(got, []string{"c1"}) {
		t.Errorf("after the scrape at +1m: limit c has %v, want [c1]", got)
	}
	fx.checkInvariants(t, "after expiry")
}

// Random observations at random instants keep the bounds and the
// structure, and the scrape agrees with a count of the live keys.
func TestSampleRandom(t *testing.T) {
	fx := newSampleFixture(t, 50, 120)
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 20000 {
		if rng.IntN(100) == 0 {
			fx.clock.Set(fx.clock.Now().Add(time.Duration(rng.IntN(10)) * time.Second))
		}
		limit := fmt.Sprint("l", rng.IntN(4))
		fx.observe(limit, fmt.Sprint("k", rng.IntN(200)), fullLevel(rng.IntN(int(numLevels))), time.Duration(rng.IntN(30))*time.Second)
		if step%1000 == 0 {
			fx.checkInvariants(t, fmt.Sprint("step ", step))
			fx.gauges(t)
		}
	}
	fx.checkInvariants(t, "end")
	now := fx.clock.Now().UnixNano()
	for limit, ks := range fx.samples {
		var live [numLevels]int
		ks.mu.Lock()
		for _, e := range ks.entries {
			if e.until > now {
				live[e.level]++
			}
		}
		ks.mu.Unlock()
		if got := ks.counts(now); got != live {
			t.Errorf("sample %s: counts %v, want %v", limit, got, live)
		}
	}
	if testutil.ToFloat64(fx.f.dropped) == 0 {
		t.Errorf("nothing dropped: the test does not reach the bounds")
	}
}

func TestNthSmallest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 1; n < 60; n++ {
		for range 20 {
			xs := make([]int64, n)
			for i := range xs {
				xs[i] = int64(rng.IntN(max(1, n/3))) // with ties
			}
			sorted := slices.Sorted(slices.Values(xs))
			k := rng.IntN(n)
			if got := nthSmallest(slices.Clone(xs), k); got != sorted[k] {
				t.Fatalf("nthSmallest(%v, %d) = %d, want %d", xs, k, got, sorted[k])
			}
		}
	}
}

// Recording a key below half full in an empty sample, and a key already
// sampled, allocate nothing: the decision path's common cases.
func TestSampleAllocatesNothing(t *testing.T) {
	fx := newSampleFixture(t, 10, 100)
	ks := fx.sample("a")
	now := fx.clock.Now().UnixNano()
	until := now + int64(time.Minute)
	key := strings.Repeat("k", 40)
	if n := testing.AllocsPerRun(100, func() { ks.observe(key, belowHalf, now, until) }); n != 0 {
		t.Errorf("a key below half full, empty sample: %v allocations, want 0", n)
	}
	ks.observe(key, full, now, until)
	other := strings.Repeat("k", 40) // an equal key in another string
	lv := halfFull
	if n := testing.AllocsPerRun(100, func() {
		ks.observe(other, lv, now, until)
		lv = halfFull + (lv+1)%3
	}); n != 0 {
		t.Errorf("a sampled key: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { ks.observe("other", belowHalf, now, until) }); n != 0 {
		t.Errorf("a key below half full, sample not empty: %v allocations, want 0", n)
	}
}

// BenchmarkSampleUpdate is a decision on a key already sampled.
func BenchmarkSampleUpdate(b *testing.B) {
	f := newFullness(0, 0, time.Now)
	var slot atomic.Pointer[keySample]
	ks := f.sampleFor(&slot, 0, sampleID{"d", "l"}, 10)
	now := time.Now().UnixNano()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("d\x00user\x00%d", i)
		ks.observe(keys[i], full, now, now+int64(time.Hour))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ks.observe(keys[i%len(keys)], mostlyFull, now, now+int64(time.Hour))
		i++
	}
}

// BenchmarkSampleChurn is a decision on a new key in a full sample: the
// amortized cost of displacing entries.
func BenchmarkSampleChurn(b *testing.B) {
	f := newFullness(0, 0, time.Now)
	var slot atomic.Pointer[keySample]
	ks := f.sampleFor(&slot, 0, sampleID{"d", "l"}, 10)
	now := time.Now().UnixNano()
	keys := make([]string, 4*DefaultFullnessKeysPerLimit)
	for i := range keys {
		keys[i] = fmt.Sprintf("d\x00user\x00%d", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ks.observe(keys[i%len(keys)], halfFull+fullLevel(i%3), now, now+int64(time.Hour)+int64(i))
		i++
	}
}
