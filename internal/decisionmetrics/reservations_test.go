package decisionmetrics

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

// TestReservationMetrics: reservation calls count by event on the limit
// that reserves (reserved, settled, settled_again, settled_without_hold,
// expired), and the hits held follow holds taken and given back; a
// reload that drops the limit's reserve deletes its series.
func TestReservationMetrics(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	ms := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(func() { ms.Close() })
	reg := prometheus.NewPedanticRegistry()
	svc, _ := observed(reg, service.Options{Store: ms}, Options{})
	f := &metricsFixture{svc: svc, reg: reg}
	f.load(t, `
domain: llm
reservation_key: request_id
descriptors:
  - key: tenant
    rate_limits:
      - {unit: hour, requests_per_unit: 100000, name: tokens, reserve: {estimate: 4000, ttl: 1m}}
      - {unit: second, requests_per_unit: 100, name: requests}
`)
	call := func(id string, hits uint64) {
		t.Helper()
		d := desc("tenant", "acme", "request_id", id)
		if hits > 0 {
			d.HasHits, d.Hits = true, hits
		}
		if _, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "llm", Descriptors: []service.Descriptor{d}}); err != nil {
			t.Fatal(err)
		}
	}
	call("a", 0)    // reserved: 4000 held
	call("b", 0)    // reserved: 8000 held
	call("a", 2500) // settled: 4000 back
	call("a", 2500) // settled again
	clock.Set(storetest.T0.Add(90 * time.Second))
	call("c", 0)    // b ended by itself at 61s; c reserved
	call("b", 1000) // settled without its hold
	want := []string{
		"domain=llm,event=expired,limit=tokens 1",
		"domain=llm,event=reserved,limit=tokens 3",
		"domain=llm,event=settled,limit=tokens 1",
		"domain=llm,event=settled_again,limit=tokens 1",
		"domain=llm,event=settled_without_hold,limit=tokens 1",
	}
	if got := f.series(t, "rls_reservations_total"); !slices.Equal(got, want) {
		t.Errorf("rls_reservations_total:\n%q\nwant\n%q", got, want)
	}
	if got, want := f.series(t, "rls_reservation_held_hits"), []string{"domain=llm,limit=tokens 4000"}; !slices.Equal(got, want) {
		t.Errorf("rls_reservation_held_hits: %q, want %q", got, want)
	}
	cfg, err := config.Parse("m.yaml", []byte(`
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100000, name: tokens}
`))
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(cfg)
	if got := append(f.series(t, "rls_reservations_total"), f.series(t, "rls_reservation_held_hits")...); len(got) != 0 {
		t.Errorf("after a reload without reserve: %q, want no reservation series", got)
	}
}
