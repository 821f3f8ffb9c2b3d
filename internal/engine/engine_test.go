package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
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
	if err := ctx.Err(); err != nil {
		return false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	states := make([]*engine.State, len(items))
	for i := range items {
		k := [2]string{items[i].Desc, items[i].Limit.ID}
		if r.states[k] == nil {
			r.states[k] = new(engine.State)
		}
		states[i] = r.states[k]
	}
	return engine.Evaluate(r.now(), items, states, results), nil
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
		alg  descriptors.Algorithm
		hits uint64
		want time.Duration // after t0; -1: 0 (already expired)
	}{
		{descriptors.FixedWindow, 1, w},
		{descriptors.FixedWindow, 0, -1},
		{descriptors.SlidingWindow, 1, 2 * w},
		{descriptors.SlidingLog, 1, w},
		{descriptors.SlidingLog, 0, -1},
		{descriptors.TokenBucket, 1, 6 * time.Second},
	} {
		l := storetest.Limit(tc.alg, 10, w, 10)
		var st engine.State
		engine.Evaluate(t0, []engine.Item{{Desc: "d/k=v", Limit: l, Hits: tc.hits}}, []*engine.State{&st}, make([]engine.Result, 1))
		got := engine.Expiry(l, &st)
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
	windows := []*descriptors.Limit{
		storetest.Limit(descriptors.FixedWindow, 1<<30, time.Second, 0),
		storetest.Limit(descriptors.SlidingWindow, 1<<30, time.Minute, 0),
		storetest.Limit(descriptors.TokenBucket, 1_000_000, time.Second, 1_000_000),
	}
	items := make([]engine.Item, len(windows))
	states := make([]*engine.State, len(windows))
	for i, l := range windows {
		items[i] = engine.Item{Desc: "api/remote_address=10.0.0.1", Limit: l, Hits: 1}
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
