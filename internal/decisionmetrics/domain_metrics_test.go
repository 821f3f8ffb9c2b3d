package decisionmetrics

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

const unmatchedConfig = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /admin
    rate_limit: {unlimited: true}
  - key: tenant
    descriptors:
      - key: plan
        rate_limit: {unit: minute, requests_per_unit: 5}
---
domain: web
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
`

// TestUnmatchedDescriptorsCounted: descriptors that match no limit are
// counted per domain, those of unknown domains under "_unknown"; matches,
// unlimited descriptors and overrides are not.
func TestUnmatchedDescriptorsCounted(t *testing.T) {
	f := newMetricsFixture(t, 0)
	f.load(t, unmatchedConfig)
	if got := f.series(t, "rls_descriptors_unmatched_total"); len(got) != 0 {
		t.Fatalf("series before any request: %v, want none", got)
	}
	over := desc("nothing", "x")
	over.Override = &service.Override{RequestsPerUnit: 1, Unit: engine.Minute}
	for _, tc := range []struct {
		domain string
		descs  []service.Descriptor
	}{
		{"api", []service.Descriptor{desc("remote_address", "10.0.0.1")}},               // matched
		{"api", []service.Descriptor{desc("path", "/admin")}},                           // unlimited: what the config says
		{"api", []service.Descriptor{over}},                                             // an override: no match needed
		{"api", []service.Descriptor{desc("user", "u")}},                                // 1: no node for the key
		{"api", []service.Descriptor{desc("tenant", "t")}},                              // 2: a node without limits
		{"api", []service.Descriptor{desc("remote_address", "1.2.3.4", "x", "y")}},      // 3: deeper than the tree
		{"api", []service.Descriptor{desc("tenant", "t", "plan", "p"), desc("a", "b")}}, // 4: one of two
		{"web", []service.Descriptor{desc("k", "v"), desc("j", "v")}},                   // web 1
		{"nope", []service.Descriptor{desc("k", "v"), desc("k", "w")}},                  // _unknown 2
	} {
		if _, err := f.svc.ShouldRateLimit(context.Background(), &service.Request{Domain: tc.domain, Descriptors: tc.descs}); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"domain=_unknown 2", "domain=api 4", "domain=web 1"}
	if got := f.series(t, "rls_descriptors_unmatched_total"); !slices.Equal(got, want) {
		t.Errorf("rls_descriptors_unmatched_total = %v, want %v", got, want)
	}

	// A reload that drops a domain deletes its series.
	f.load(t, "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	want = []string{"domain=_unknown 2", "domain=api 4"}
	if got := f.series(t, "rls_descriptors_unmatched_total"); !slices.Equal(got, want) {
		t.Errorf("after a reload without web: %v, want %v", got, want)
	}
}

// TestUnmatchedCostsNoAllocation: counting an unmatched descriptor
// allocates nothing once its series exists.
func TestUnmatchedCostsNoAllocation(t *testing.T) {
	f := newMetricsFixture(t, 0)
	f.load(t, unmatchedConfig)
	cur := f.m.current.Load()
	req := &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("remote_address", "10.0.0.1"), desc("user", "u")}}
	d := &service.Decision{Request: req, Domain: cur.cfg.Domain("api"), Response: &service.Response{Code: service.OK}, Unmatched: 1}
	count := func() { f.m.Decided(cur, d) }
	count() // makes the series
	if allocs := testing.AllocsPerRun(100, count); allocs != 0 {
		t.Errorf("counting an unmatched descriptor: %v allocations, want 0", allocs)
	}
	if got := f.series(t, "rls_descriptors_unmatched_total"); !slices.Equal(got, []string{"domain=api 102"}) {
		t.Errorf("series %v, want api counted 102 times", got)
	}
}

func BenchmarkShouldRateLimitUnmatched(b *testing.B) {
	cfg, err := config.Parse("m.yaml", []byte(unmatchedConfig))
	if err != nil {
		b.Fatal(err)
	}
	ms := memstore.New(memstore.Options{})
	defer ms.Close()
	svc, _ := observed(prometheus.NewRegistry(), service.Options{Store: ms}, Options{})
	svc.SetConfig(cfg)
	req := &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("remote_address", "10.0.0.1"), desc("user", "u")}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
