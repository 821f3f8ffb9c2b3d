package service

import (
	"testing"

	"github.com/rlsproject/rls/internal/config"
)

// TestExplainConcurrencyLimit: an explanation gives a concurrency limit's
// lease_ttl (which is also its window).
func TestExplainConcurrencyLimit(t *testing.T) {
	cfg, err := config.Parse("cc.yaml", []byte(`
domain: api
descriptors:
  - key: job
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: concurrency, lease_ttl: 45s}
`))
	if err != nil {
		t.Fatal(err)
	}
	dom := cfg.Domain("api")
	le := explainLimit(dom, dom.Match([]config.Entry{{Key: "job", Value: "x"}}).Limits[0])
	if le.Algorithm != "concurrency" || le.LeaseTTL != "45s" || le.Window != "45s" || le.RequestsPerUnit != 2 || le.Label != "job/concurrency" {
		t.Errorf("explanation %+v, want concurrency, lease_ttl and window 45s, 2, label job/concurrency", le)
	}
}
