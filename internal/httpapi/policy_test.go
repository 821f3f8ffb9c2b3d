package httpapi

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// TestAuthHeadersOfTokenBucketsAndCalendarMonths: /auth's headers say a
// token bucket's burst over its fill time (the audit's {1/s, burst 3}
// said "1" and remaining 2) and a calendar month's own length (it said 30
// days in February).
func TestAuthHeadersOfTokenBucketsAndCalendarMonths(t *testing.T) {
	const yaml = `
domain: web
http_descriptors:
  - actions: [{remote_address: {}}]
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
      - {unit: month, requests_per_unit: 1000, calendar: true}
`
	clock := storetest.NewClock(time.Date(2024, 2, 10, 12, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	svc := servetest.Service(t, yaml, service.Options{Store: servetest.MemoryStore(t, clock.Now), Now: clock.Now})
	srv := httptest.NewServer(New(Options{Service: svc, Gatherer: reg}))
	t.Cleanup(srv.Close)
	f := &fixture{srv: srv, svc: svc}
	for i, want := range []struct {
		code      int
		remaining string
	}{{200, "2"}, {200, "1"}, {200, "0"}, {429, "0"}} {
		resp, _ := f.do(t, "GET", "/auth/web", map[string]string{"X-Real-IP": "203.0.113.7"}, "")
		h := resp.Header
		if resp.StatusCode != want.code || h.Get("X-RateLimit-Remaining") != want.remaining ||
			h.Get("X-RateLimit-Limit") != `3, 3;w=3, 1000;w=2505600` ||
			h.Get("RateLimit-Policy") != `"remote_address/1s";q=3;w=3, "remote_address/1mo";q=1000;w=2505600` {
			t.Errorf("request %d: %d X-RateLimit-Limit %q -Remaining %q RateLimit-Policy %q; want %d, 3 per 3 s and February's 29 days, remaining %s",
				i, resp.StatusCode, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("RateLimit-Policy"), want.code, want.remaining)
		}
	}
}
