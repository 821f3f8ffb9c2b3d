package memstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
)

// TestCollectors: the gauges follow Stats, scrape by scrape.
func TestCollectors(t *testing.T) {
	s := New(Options{Now: storetest.NewClock(storetest.T0).Now})
	defer s.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collectors()...)
	l := storetest.Rule(engine.FixedWindow, 10, time.Minute, 0)
	for i, desc := range []string{"", "d/k=1", "d/k=2"} {
		if desc != "" {
			items := []engine.Item{{Desc: desc, Rule: l, Hits: 1}}
			if ok, err := s.Apply(context.Background(), items, make([]engine.Result, 1)); !ok || err != nil {
				t.Fatalf("step %d: Apply(%s) = %v %v, want admitted", i, desc, ok, err)
			}
		}
		n, b := s.Stats()
		if n != i || (i > 0 && b == 0) {
			t.Fatalf("step %d: Stats() = %d counters, %d bytes; want %d counters taking some bytes", i, n, b, i)
		}
		want := `
# HELP rls_memstore_bytes Bytes the memory store's counters are counted as taking (bounded by --memory-limit).
# TYPE rls_memstore_bytes gauge
rls_memstore_bytes ` + strconv.FormatInt(b, 10) + `
# HELP rls_memstore_counters Counters held by the memory store.
# TYPE rls_memstore_counters gauge
rls_memstore_counters ` + strconv.Itoa(n) + "\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
			t.Errorf("step %d: %v", i, err)
		}
	}
}
