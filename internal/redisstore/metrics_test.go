package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

// TestCollectors: the counters follow Stats, under the names and help that
// dashboards know.
func TestCollectors(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL()})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collectors()...)
	items := []engine.Item{{Desc: "d/k=v", Limit: storetest.Limit(descriptors.FixedWindow, 2, time.Hour, 0), Hits: 1}}
	results := make([]engine.Result, 1)
	for range 3 { // 2 admitted, 1 denied: 3 decisions
		if _, err := s.Apply(context.Background(), items, results); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Decisions != 3 || st.Errors != 0 {
		t.Fatalf("Stats() = %+v, want 3 decisions and no error", st)
	}
	var want strings.Builder
	for _, m := range []struct {
		name, help string
		v          uint64
	}{
		{"rls_deny_cache_hits_total", "Requests denied from the denial cache without a round trip.", st.CacheHits},
		{"rls_redis_decisions_total", "Requests decided by Redis scripts.", st.Decisions},
		{"rls_redis_errors_total", "Store calls that failed.", st.Errors},
		{"rls_redis_releases_total", "Cluster reservations released because another node denied the request.", st.Releases},
		{"rls_redis_round_trips_total", "Pipelines sent to Redis; decisions/round trips is the batching.", st.RoundTrips},
		{"rls_redis_scripts_total", "Scripts sent to Redis (EVALSHA, or EVAL after NOSCRIPT).", st.Scripts},
	} {
		fmt.Fprintf(&want, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", m.name, m.help, m.name, m.name, m.v)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String())); err != nil {
		t.Error(err)
	}
}
