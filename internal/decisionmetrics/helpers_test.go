package decisionmetrics

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

// observed returns a service built with opts whose decisions metrics,
// built with mopts and registered in reg, observe (as the daemon installs
// them), and the metrics.
func observed(reg prometheus.Registerer, opts service.Options, mopts Options) (*service.Service, *Metrics) {
	m := New(reg, mopts)
	opts.Observers = append([]service.Observer{m}, opts.Observers...)
	return service.New(opts), m
}

func desc(kv ...string) service.Descriptor {
	var d service.Descriptor
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// benchDecisions measures ShouldRateLimit of one descriptor that three
// limits judge on the memory store, observed by rls's metrics, on a
// service configured by opts (its store and observers aside): the
// service's BenchmarkShouldRateLimit with the metrics the daemon installs.
// The third limit (an hour's sliding window) admits perHour hits: a
// billion admits everything, 1 denies every request after the first.
func benchDecisions(b *testing.B, opts service.Options, perHour uint32) {
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: %d, algorithm: sliding_window}
`, perHour)))
	if err != nil {
		b.Fatal(err)
	}
	ms := memstore.New(memstore.Options{})
	b.Cleanup(func() { ms.Close() })
	opts.Store = ms
	svc, _ := observed(prometheus.NewRegistry(), opts, Options{})
	svc.SetConfig(cfg)
	req := &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("remote_address", "10.0.0.1")}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkShouldRateLimit is a decision that every limit admits, and its
// metrics.
func BenchmarkShouldRateLimit(b *testing.B) {
	benchDecisions(b, service.Options{}, 1e9)
}
