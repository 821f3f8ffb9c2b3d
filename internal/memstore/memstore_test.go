package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
		s := New(Options{Now: now})
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func hit(t *testing.T, s *Store, desc string, l *engine.Rule) bool {
	t.Helper()
	ok, err := s.Apply(context.Background(), []engine.Item{{Desc: desc, Rule: l, Hits: 1}}, make([]engine.Result, 1))
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestMemoryBounded(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	const maxBytes = 1 << 20
	s := New(Options{Now: clock.Now, MaxBytes: maxBytes})
	defer s.Close()
	l := storetest.Rule(engine.FixedWindow, 10, time.Hour, 0)
	// A flood of distinct values, far more than fit.
	for i := range 100_000 {
		hit(t, s, fmt.Sprintf("api/remote_address=10.%d.%d.%d", i>>16, (i>>8)&255, i&255), l)
	}
	counters, bytes := s.Stats()
	if bytes > maxBytes {
		t.Errorf("after 100000 distinct counters: %d bytes held, want ≤ %d", bytes, maxBytes)
	}
	if counters < 1000 {
		t.Errorf("after 100000 distinct counters only %d are kept under a 1 MiB bound; eviction is too eager", counters)
	}
	// The store still counts correctly for a key that is in use.
	for i := range 10 {
		if !hit(t, s, "api/remote_address=hot", l) {
			t.Fatalf("hit %d of 10 on a fresh key denied", i+1)
		}
	}
	if hit(t, s, "api/remote_address=hot", l) {
		t.Error("hit 11 of a limit of 10 admitted")
	}
}

func TestEvictsClosestToExpiryFirst(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s := New(Options{Now: clock.Now, MaxBytes: numShards * 4 * (entryOverhead + counterOverhead)})
	defer s.Close()
	day := storetest.Rule(engine.FixedWindow, 1, 24*time.Hour, 0)
	second := storetest.Rule(engine.FixedWindow, 1, time.Second, 0)
	// One long-lived counter, then many short-lived ones in the same store.
	hit(t, s, "d/k=long", day)
	for i := range 2000 {
		hit(t, s, fmt.Sprintf("d/k=short%d", i), second)
	}
	if hit(t, s, "d/k=long", day) {
		t.Error("the day counter was evicted before the second counters that expire first")
	}
}

func TestExpiredCountersReclaimed(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s := New(Options{Now: clock.Now, SweepEvery: time.Millisecond})
	defer s.Close()
	l := storetest.Rule(engine.SlidingLog, 5, time.Second, 0)
	for i := range 1000 {
		hit(t, s, fmt.Sprintf("d/k=%d", i), l)
	}
	if n, _ := s.Stats(); n != 1000 {
		t.Fatalf("counters = %d, want 1000", n)
	}
	clock.Set(storetest.T0.Add(time.Minute))
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, bytes := s.Stats()
		if n == 0 && bytes == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the last hit, %d counters (%d bytes) are still held", n, bytes)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDeniedFirstRequestKeepsNothing(t *testing.T) {
	s := New(Options{Now: storetest.NewClock(storetest.T0).Now})
	defer s.Close()
	zero := storetest.Rule(engine.FixedWindow, 0, time.Hour, 0)
	for i := range 100 {
		if hit(t, s, fmt.Sprintf("d/k=%d", i), zero) {
			t.Fatal("a limit of 0 admitted")
		}
	}
	if n, bytes := s.Stats(); n != 0 || bytes != 0 {
		t.Errorf("after 100 denied requests on distinct keys the store holds %d counters (%d bytes), want 0", n, bytes)
	}
}

func TestCloseIdempotent(t *testing.T) {
	s := New(Options{})
	s.Close()
	s.Close()
}

func BenchmarkApply(b *testing.B) {
	s := New(Options{})
	defer s.Close()
	items := []engine.Item{
		{Desc: "api/remote_address=10.0.0.1", Rule: storetest.Rule(engine.FixedWindow, 1<<30, time.Second, 0), Hits: 1},
		{Desc: "api/remote_address=10.0.0.1", Rule: storetest.Rule(engine.FixedWindow, 1<<30, time.Minute, 0), Hits: 1},
		{Desc: "api/remote_address=10.0.0.1", Rule: storetest.Rule(engine.SlidingWindow, 1<<30, time.Hour, 0), Hits: 1},
	}
	results := make([]engine.Result, len(items))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s.Apply(ctx, items, results)
	}
}

func BenchmarkApplyParallel(b *testing.B) {
	s := New(Options{})
	defer s.Close()
	l := storetest.Rule(engine.FixedWindow, 1<<30, time.Second, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		results := make([]engine.Result, 1)
		i := 0
		for pb.Next() {
			i++
			items := []engine.Item{{Desc: fmt.Sprintf("api/ip=%d", i%1024), Rule: l, Hits: 1}}
			s.Apply(context.Background(), items, results)
		}
	})
}
