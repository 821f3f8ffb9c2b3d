package memstore

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
)

// BenchmarkActiveKeys shows the decision time from 1,000 to 1,000,000 active
// counters, and reports the bytes each active counter costs: the store's
// own accounting (bytes/key) and the Go heap growth (heap-bytes/key).
func BenchmarkActiveKeys(b *testing.B) {
	l := storetest.Rule(engine.FixedWindow, 1<<30, time.Hour, 0)
	for _, n := range []int{1_000, 10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			s := New(Options{MaxBytes: 4 << 30})
			defer s.Close()
			descs := make([]string, n)
			results := make([]engine.Result, 1)
			ctx := context.Background()
			for i := range descs {
				descs[i] = fmt.Sprintf("api/remote_address=10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
				s.Apply(ctx, []engine.Item{{Desc: descs[i], Rule: l, Hits: 1}}, results)
			}
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			counters, bytes := s.Stats()
			if counters != n {
				b.Fatalf("%d counters held, want %d", counters, n)
			}
			items := []engine.Item{{Rule: l, Hits: 1}}
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				items[0].Desc = descs[i%n]
				i += 7919 // a prime stride: no locality between requests
				s.Apply(ctx, items, results)
			}
			b.ReportMetric(float64(bytes)/float64(n), "bytes/key")
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-bytes/key")
		})
	}
}
