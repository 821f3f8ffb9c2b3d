package engine_test

import (
	"context"
	"math/big"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
)

// reference is the plainest engine.Store: one lock, one State per counter
// for ever, engine.Evaluate. The conformance suite's timelines are checked
// against it, so that they describe the algorithms themselves rather than
// what a store adds (sharding, expiry, eviction, Redis).
type reference struct {
	mu     sync.Mutex
	now    func() time.Time
	states map[[2]string]*engine.State // by descriptor identity and limit ID
}

func (r *reference) Apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	return r.decide(ctx, engine.Evaluate, items, results)
}

func (r *reference) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	return r.decide(ctx, engine.Peek, items, results)
}

func (r *reference) decide(ctx context.Context, f func(time.Time, []engine.Item, []*engine.State, []engine.Result) bool, items []engine.Item, results []engine.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	states := make([]*engine.State, len(items))
	for i := range items {
		k := [2]string{items[i].Desc, items[i].Rule.ID}
		if r.states[k] == nil {
			r.states[k] = new(engine.State)
		}
		states[i] = r.states[k]
	}
	return f(r.now(), items, states, results), nil
}

// Ping implements engine.Store.
func (r *reference) Ping(context.Context) error { return nil }

// Reset implements engine.Store.
func (r *reference) Reset(_ context.Context, items []engine.Item) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for i := range items {
		k := [2]string{items[i].Desc, items[i].Rule.ID}
		if r.states[k] != nil {
			n++
		}
		delete(r.states, k)
	}
	return n, nil
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
		return &reference{now: now, states: make(map[[2]string]*engine.State)}
	})
}

func TestExpiry(t *testing.T) {
	w := time.Minute
	t0 := storetest.T0
	for _, tc := range []struct {
		alg  string
		hits uint64
		want time.Duration // after t0; -1: 0 (already expired)
	}{
		{engine.FixedWindow, 1, w},
		{engine.FixedWindow, 0, -1},
		{engine.SlidingWindow, 1, 2 * w},
		{engine.SlidingLog, 1, w},
		{engine.SlidingLog, 0, -1},
		{engine.TokenBucket, 1, 6 * time.Second},
	} {
		l := storetest.Rule(tc.alg, 10, w, 10)
		var st engine.State
		engine.Evaluate(t0, []engine.Item{{Desc: "d/k=v", Rule: l, Hits: tc.hits}}, []*engine.State{&st}, make([]engine.Result, 1))
		got := l.Expiry(&st)
		want := int64(0)
		if tc.want >= 0 {
			want = t0.Add(tc.want).UnixMicro()
		}
		if got != want {
			t.Errorf("%s after %d hits at T0: Expiry = %d, want %d", tc.alg, tc.hits, got, want)
		}
	}
}

func BenchmarkEvaluate(b *testing.B) {
	windows := []*engine.Rule{
		storetest.Rule(engine.FixedWindow, 1<<30, time.Second, 0),
		storetest.Rule(engine.SlidingWindow, 1<<30, time.Minute, 0),
		storetest.Rule(engine.TokenBucket, 1_000_000, time.Second, 1_000_000),
	}
	items := make([]engine.Item, len(windows))
	states := make([]*engine.State, len(windows))
	for i, l := range windows {
		items[i] = engine.Item{Desc: "api/remote_address=10.0.0.1", Rule: l, Hits: 1}
		states[i] = new(engine.State)
	}
	results := make([]engine.Result, len(items))
	now := storetest.T0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		engine.Evaluate(now, items, states, results)
	}
}

// TestAlgorithmCodes: an algorithm's code is its place in the registry (the
// Redis scripts' table follows it), and configs name each algorithm that is
// not a form of another.
func TestAlgorithmCodes(t *testing.T) {
	for code, name := range engine.Algorithms() {
		spec := engine.Spec{Algorithm: name, Unit: engine.Day, Multiplier: 1, Limit: 1}
		switch name {
		case "calendar_window":
			spec = engine.Spec{Unit: engine.Day, Multiplier: 1, Limit: 1, Calendar: true}
		case engine.Concurrency:
			spec.LeaseTTL = engine.Some(time.Minute)
		}
		r, errs := engine.Compile(spec)
		if len(errs) > 0 {
			t.Errorf("Compile(%+v): %v", spec, errs)
			continue
		}
		if int(r.Code()) != code {
			t.Errorf("algorithm %s: code %d, registered at %d", name, r.Code(), code)
		}
	}
	if got, want := engine.AlgorithmNames(), "fixed_window|sliding_window|sliding_log|token_bucket|concurrency"; got != want {
		t.Errorf("AlgorithmNames() = %q, want %q", got, want)
	}
}

// TestRuleQuestions: what code outside the engine asks of a rule instead
// of testing its algorithm's name, answered by each algorithm.
func TestRuleQuestions(t *testing.T) {
	type answers struct{ refills, burst, inFlight, windowInID, ownKey, defaultAlg bool }
	for _, step := range []struct {
		spec engine.Spec
		want answers
	}{
		{engine.Spec{}, answers{windowInID: true, defaultAlg: true}},
		{engine.Spec{Algorithm: engine.FixedWindow, Unit: engine.Day, Calendar: true}, answers{defaultAlg: true}},
		{engine.Spec{Algorithm: engine.SlidingWindow}, answers{windowInID: true}},
		{engine.Spec{Algorithm: engine.SlidingLog}, answers{windowInID: true, ownKey: true}},
		{engine.Spec{Algorithm: engine.TokenBucket}, answers{refills: true, burst: true, windowInID: true}},
		{engine.Spec{Algorithm: engine.Concurrency, LeaseTTL: engine.Some(time.Minute)}, answers{inFlight: true, ownKey: true}},
	} {
		s := step.spec
		s.Multiplier, s.Limit = 1, 10
		if s.Unit == engine.UnitUnknown {
			s.Unit = engine.Second
		}
		r := engine.MustCompile(s)
		got := answers{r.Refills(), r.HasBurst(), r.InFlight(), r.WindowInIdentity(), r.OwnKey(), r.DefaultAlgorithm()}
		if got != step.want {
			t.Errorf("%s (calendar %v): %+v, want %+v", r.Algorithm(), s.Calendar, got, step.want)
		}
	}
}

// TestTokenBucketQuotaWindowAgainstBigRat: a token bucket's advertised window is
// ⌈burst × window ÷ requests_per_unit⌉ seconds, computed exactly (128-bit
// arithmetic) for every limit the config admits, checked against math/big
// on seeded random limits; the advertised rate never exceeds the
// configured one, and the default burst advertises the limit's own window.
func TestTokenBucketQuotaWindowAgainstBigRat(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	units := []engine.Unit{engine.Second, engine.Minute, engine.Hour, engine.Day, engine.Week, engine.Month, engine.Year}
	for n := 0; n < 20000; n++ {
		u, m := units[rng.IntN(len(units))], uint32(1+rng.IntN(100))
		w := time.Duration(m) * u.Duration()
		r := uint32(1 + rng.Uint64N(uint64(min(w.Microseconds(), 1<<32-1))))
		interval := (w.Microseconds() + int64(r) - 1) / int64(r)
		b := uint32(1 + rng.Uint64N(uint64(min(1<<53/interval, 1<<32-1))))
		if n%4 == 0 {
			b = r // the default burst
		}
		got := engine.MustCompile(engine.Spec{Algorithm: engine.TokenBucket, Unit: u, Multiplier: m, Limit: r, Burst: engine.Some[uint32](b)}).QuotaWindow(time.Time{})
		exact := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(int64(b)), big.NewInt(w.Microseconds())), new(big.Int).Mul(big.NewInt(int64(r)), big.NewInt(1e6)))
		secs := new(big.Int).Quo(exact.Num(), exact.Denom())
		if !exact.IsInt() {
			secs.Add(secs, big.NewInt(1))
		}
		if want := time.Duration(secs.Int64()) * time.Second; got != want {
			t.Fatalf("seed %d: QuotaWindow(%d per %s, burst %d) = %s, want ⌈%s⌉ s = %s", seed, r, w, b, got, exact.FloatString(6), want)
		}
		// b/got ≤ r/w, the configured rate.
		if new(big.Int).Mul(big.NewInt(int64(b)), big.NewInt(w.Microseconds())).Cmp(new(big.Int).Mul(big.NewInt(int64(r)), big.NewInt(got.Microseconds()))) > 0 {
			t.Fatalf("seed %d: %d per %s, burst %d: advertised %d per %s, more than the configured rate", seed, r, w, b, b, got)
		}
		if b == r && got != w {
			t.Fatalf("seed %d: %d per %s with the default burst advertises a window of %s", seed, r, w, got)
		}
	}
}
