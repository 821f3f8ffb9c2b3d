package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	items := []engine.Item{{Desc: "d/k=v", Rule: storetest.Rule(engine.FixedWindow, 2, time.Hour, 0), Hits: 1}}
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
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		m := f.GetMetric()[0]
		got[f.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	cs, _ := s.DenyCacheStats()
	for name, v := range map[string]uint64{
		"rls_deny_cache_lookups_total": cs.Lookups,
		"rls_deny_cache_entries":       cs.Entries,
		"rls_deny_cache_evicted_total": cs.Evicted,
	} {
		if g, ok := got[name]; !ok || g != float64(v) {
			t.Errorf("%s = %v (exported %v), want %d", name, g, ok, v)
		}
		delete(got, name)
	}
	for name, v := range map[string]uint64{
		"rls_deny_cache_hits_total":     st.CacheHits,
		"rls_redis_decisions_total":     st.Decisions,
		"rls_redis_errors_total":        st.Errors,
		"rls_redis_releases_total":      st.Releases,
		"rls_redis_round_trips_total":   st.RoundTrips,
		"rls_redis_scripts_total":       st.Scripts,
		"rls_redis_expired_total":       st.Expired,
		"rls_redis_resent_total":        st.Resent,
		"rls_redis_given_back_total":    st.GivenBack,
		"rls_redis_indeterminate_total": st.Indeterminate,
	} {
		if g, ok := got[name]; !ok || g != float64(v) {
			t.Errorf("%s = %v (exported %v), want %d", name, g, ok, v)
		}
		delete(got, name)
	}
	for name := range got {
		t.Errorf("%s is exported but not checked here", name)
	}
}
