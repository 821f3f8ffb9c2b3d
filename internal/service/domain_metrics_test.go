package service

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/memstore"
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
	over.Override = &Override{RequestsPerUnit: 1, Unit: engine.Minute}
	for _, tc := range []struct {
		domain string
		descs  []Descriptor
	}{
		{"api", []Descriptor{desc("remote_address", "10.0.0.1")}},               // matched
		{"api", []Descriptor{desc("path", "/admin")}},                           // unlimited: what the config says
		{"api", []Descriptor{over}},                                             // an override: no match needed
		{"api", []Descriptor{desc("user", "u")}},                                // 1: no node for the key
		{"api", []Descriptor{desc("tenant", "t")}},                              // 2: a node without limits
		{"api", []Descriptor{desc("remote_address", "1.2.3.4", "x", "y")}},      // 3: deeper than the tree
		{"api", []Descriptor{desc("tenant", "t", "plan", "p"), desc("a", "b")}}, // 4: one of two
		{"web", []Descriptor{desc("k", "v"), desc("j", "v")}},                   // web 1
		{"nope", []Descriptor{desc("k", "v"), desc("k", "w")}},                  // _unknown 2
	} {
		if _, err := f.svc.ShouldRateLimit(context.Background(), &Request{Domain: tc.domain, Descriptors: tc.descs}); err != nil {
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

// TestUnmatchedCostsNoAllocation: matching and counting an unmatched
// descriptor allocates nothing once its series exists.
func TestUnmatchedCostsNoAllocation(t *testing.T) {
	f := newMetricsFixture(t, 0)
	f.load(t, unmatchedConfig)
	cur := f.svc.current.Load()
	dom := cur.cfg.Domain("api")
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1"), desc("user", "u")}}
	sc := new(scratch)
	count := func() {
		if _, n := sc.resolve(dom, req); n > 0 {
			cur.domains[dom.Name].countUnmatched(n)
		}
	}
	count() // makes the series and grows the scratch
	if allocs := testing.AllocsPerRun(100, count); allocs != 0 {
		t.Errorf("resolving and counting an unmatched descriptor: %v allocations, want 0", allocs)
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
	svc := New(Options{Store: ms, Registry: prometheus.NewRegistry()})
	svc.SetConfig(cfg)
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1"), desc("user", "u")}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
