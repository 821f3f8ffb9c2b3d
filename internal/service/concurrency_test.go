package service

import (
	"context"
	"testing"
	"time"
)

// TestExplainConcurrencyLimit: an explanation gives a concurrency limit's
// lease_ttl (which is also its window), and none for other algorithms.
func TestExplainConcurrencyLimit(t *testing.T) {
	svc, _ := headerFixture(t, `
domain: api
descriptors:
  - key: job
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: concurrency, lease_ttl: 45s}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
`, time.Date(2024, 2, 10, 12, 0, 0, 0, time.UTC))
	ex, err := svc.Explain(context.Background(), &Request{Domain: "api", Descriptors: []Descriptor{desc("job", "x"), desc("user", "u")}})
	if err != nil {
		t.Fatal(err)
	}
	job, user := ex.Descriptors[0].Limits[0], ex.Descriptors[1].Limits[0]
	if job.LeaseTTL != 45*time.Second || job.Limit.Rule.Window != 45*time.Second || user.LeaseTTL != 0 {
		t.Errorf("explanation %+v, %+v; want lease_ttl 45s (the window) for the concurrency limit, none for the other", job, user)
	}
}
