package decisionmetrics

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

// failing is a store that fails every call while fail is set.
type failing struct {
	*memstore.Store
	fail atomic.Bool
}

var errDown = errors.New("store down")

func (s *failing) Apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if s.fail.Load() {
		return false, errDown
	}
	return s.Store.Apply(ctx, items, results)
}

const answersConfig = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: tenant
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// TestMetricsOfAnswers is a timeline of what the service tells its
// observers and the series it makes: answers by code, store calls (timed,
// as on Redis) and their failures, verdicts and shadow denials, requests
// that can never pass, unmatched descriptors, config loads and resets.
// Explanations count nothing.
func TestMetricsOfAnswers(t *testing.T) {
	store := &failing{Store: memstore.New(memstore.Options{Now: storetest.NewClock(storetest.T0).Now})}
	t.Cleanup(func() { store.Close() })
	reg := prometheus.NewPedanticRegistry()
	svc, _ := observed(reg, service.Options{Store: store, StoreDoesIO: true}, Options{})
	f := &metricsFixture{svc: svc, reg: reg}
	ctx := context.Background()
	good, err := config.Parse("a.yaml", []byte(answersConfig))
	if err != nil {
		t.Fatal(err)
	}
	ask := func(domain string, hits uint64, kv ...string) {
		t.Helper()
		d := desc(kv...)
		d.HasHits, d.Hits = true, hits
		svc.ShouldRateLimit(ctx, &service.Request{Domain: domain, Descriptors: []service.Descriptor{d}})
	}
	for i, st := range []struct {
		what string
		do   func()
		want map[string][]string // series by metric, as metricsFixture.series writes them
	}{
		{"a config loaded", func() { svc.Reload(func() (*config.Config, error) { return good, nil }) }, map[string][]string{
			"rls_config_last_reload_successful": {" 1"},
			"rls_config_reloads_total":          {"result=success 1"},
			"rls_config_domains":                {" 1"},
			"rls_config_limits":                 {" 2"},
			"rls_requests_total":                {"code=OK 0", "code=OVER_LIMIT 0", "code=error 0"},
		}},
		{"an admitted request", func() { ask("api", 1, "remote_address", "a") }, map[string][]string{
			"rls_requests_total":         {"code=OK 1", "code=OVER_LIMIT 0", "code=error 0"},
			"rls_decisions_total":        {"domain=api,limit=remote_address/1s,result=ok 1"},
			"rls_store_duration_seconds": {"outcome=error 0", "outcome=ok 1"},
		}},
		{"a shadow limit over, twice", func() { ask("api", 1, "tenant", "t"); ask("api", 1, "tenant", "t") }, map[string][]string{
			"rls_requests_total":       {"code=OK 3", "code=OVER_LIMIT 0", "code=error 0"},
			"rls_shadow_denials_total": {"domain=api,limit=tenant/1m 1"},
		}},
		{"4 hits against 3 a second", func() { ask("api", 4, "remote_address", "b") }, map[string][]string{
			"rls_requests_total":            {"code=OK 3", "code=OVER_LIMIT 1", "code=error 0"},
			"rls_requests_impossible_total": {"domain=api 1"},
		}},
		{"an explanation", func() {
			svc.Explain(ctx, &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("remote_address", "a")}})
		}, map[string][]string{
			"rls_requests_total":         {"code=OK 3", "code=OVER_LIMIT 1", "code=error 0"},
			"rls_store_duration_seconds": {"outcome=error 0", "outcome=ok 4"},
		}},
		{"an unknown domain and an unmatched key", func() { ask("nope", 1, "k", "v"); ask("api", 1, "user", "u") }, map[string][]string{
			"rls_requests_total":              {"code=OK 5", "code=OVER_LIMIT 1", "code=error 0"},
			"rls_descriptors_unmatched_total": {"domain=_unknown 1", "domain=api 1"},
		}},
		{"the store fails", func() { store.fail.Store(true); ask("api", 1, "remote_address", "a"); store.fail.Store(false) }, map[string][]string{
			"rls_requests_total":         {"code=OK 5", "code=OVER_LIMIT 1", "code=error 1"},
			"rls_store_errors_total":     {" 1"},
			"rls_store_duration_seconds": {"outcome=error 1", "outcome=ok 4"},
			"rls_decisions_total":        {"domain=api,limit=remote_address/1s,result=ok 1", "domain=api,limit=remote_address/1s,result=over_limit 1", "domain=api,limit=tenant/1m,result=ok 1", "domain=api,limit=tenant/1m,result=shadow_over_limit 1"},
		}},
		{"a load fails", func() { svc.Reload(func() (*config.Config, error) { return nil, errors.New("bad.yaml:1:1: no") }) }, map[string][]string{
			"rls_config_last_reload_successful": {" 0"},
			"rls_config_reloads_total":          {"result=failure 1", "result=success 1"},
		}},
		{"a reset", func() {
			if _, err := svc.Reset(ctx, &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("remote_address", "a")}}); err != nil {
				t.Fatal(err)
			}
		}, map[string][]string{
			"rls_resets_total":         {" 1"},
			"rls_reset_counters_total": {" 1"},
		}},
	} {
		st.do()
		for name, want := range st.want {
			if got := f.series(t, name); !slices.Equal(got, want) {
				t.Errorf("step %d (%s): %s\n\t%s\nwant\n\t%s", i+1, st.what, name, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
			}
		}
	}
}

// TestShadowModeGauge: rls_shadow_mode is 1 under --shadow, else 0.
func TestShadowModeGauge(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		reg := prometheus.NewPedanticRegistry()
		New(reg, Options{ShadowAll: shadow})
		want := []string{" 0"}
		if shadow {
			want = []string{" 1"}
		}
		if got := (&metricsFixture{reg: reg}).series(t, "rls_shadow_mode"); !slices.Equal(got, want) {
			t.Errorf("ShadowAll %v: rls_shadow_mode %v, want %v", shadow, got, want)
		}
	}
}

// TestMetricsAllocateNothing: a decision observed by the metrics
// allocates no more than the same decision unobserved, for each kind of
// answer once its series exist: admitted, denied with its key sampled as
// full, on a per-value series, an override, unmatched, an unknown domain.
func TestMetricsAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops scratch: make test counts allocations in a run without -race")
	}
	cfg, err := config.Parse("pv.yaml", []byte(perValueConfig+`
  - key: small
    rate_limit: {unit: hour, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	over := desc("o", "v")
	over.Override = &service.Override{RequestsPerUnit: 5, Unit: engine.Minute}
	services := make([]*service.Service, 2) // unobserved, observed
	for i := range services {
		ms := memstore.New(memstore.Options{Now: storetest.NewClock(storetest.T0).Now})
		t.Cleanup(func() { ms.Close() })
		services[i] = service.New(service.Options{Store: ms})
		if i == 1 {
			services[i], _ = observed(prometheus.NewRegistry(), service.Options{Store: ms}, Options{})
		}
		services[i].SetConfig(cfg)
	}
	for _, tc := range []struct {
		name string
		req  *service.Request
	}{
		{"admitted", &service.Request{Domain: "d", Descriptors: []service.Descriptor{desc("plain", "x")}}},
		{"denied, full", &service.Request{Domain: "d", Descriptors: []service.Descriptor{desc("small", "x")}}},
		{"per value", &service.Request{Domain: "d", Descriptors: []service.Descriptor{desc("ip", "10.0.0.1")}}},
		{"override", &service.Request{Domain: "d", Descriptors: []service.Descriptor{over}}},
		{"unmatched", &service.Request{Domain: "d", Descriptors: []service.Descriptor{desc("nothing", "here")}}},
		{"unknown domain", &service.Request{Domain: "nope", Descriptors: []service.Descriptor{desc("k", "v")}}},
	} {
		var allocs [2]float64
		for i, svc := range services {
			decide := func() {
				if _, err := svc.ShouldRateLimit(context.Background(), tc.req); err != nil {
					t.Fatal(err)
				}
			}
			decide() // makes the series, samples the key, grows the buffers
			allocs[i] = testing.AllocsPerRun(100, decide)
		}
		if allocs[1] != allocs[0] {
			t.Errorf("%s: %v allocations observed by the metrics, %v unobserved; want the same", tc.name, allocs[1], allocs[0])
		}
	}
}
