package authz

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// TestCheckHeadersOfTokenBucketsAndCalendarMonths: ext_authz's headers,
// allowed and denied, say a token bucket's burst over its fill time and a
// calendar month's own length (the audit's {1/s, burst 3} said "1" with 2
// remaining, and every month was 30 days).
func TestCheckHeadersOfTokenBucketsAndCalendarMonths(t *testing.T) {
	const yaml = `
domain: web
http_descriptors:
  - actions: [{remote_address: {}}]
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
      - {unit: month, requests_per_unit: 1000, calendar: true, time_zone: America/New_York}
`
	// March 2024 in New York: 31 days less the hour that summer time skips.
	clock := storetest.NewClock(time.Date(2024, 3, 20, 12, 0, 0, 0, time.UTC))
	svc := servetest.Service(t, yaml, service.Options{Store: servetest.MemoryStore(t, clock.Now), Now: clock.Now})
	s := New(svc, nil)
	const wantLimit, wantPolicy = `3, 3;w=3, 1000;w=2674800`, `"remote_address/1s";q=3;w=3, "remote_address/1mo";q=1000;w=2674800`
	for i, remaining := range []string{"2", "1", "0", "0"} {
		resp, err := s.Check(context.Background(), checkRequest("web", "192.0.2.1", "GET", "/", nil))
		if err != nil {
			t.Fatal(err)
		}
		hdrs := resp.GetOkResponse().GetResponseHeadersToAdd()
		if i == 3 {
			hdrs = resp.GetDeniedResponse().GetHeaders()
		}
		h := headerMap(hdrs)
		if h["x-ratelimit-limit"] != wantLimit || h["ratelimit-policy"] != wantPolicy || h["x-ratelimit-remaining"] != remaining {
			t.Errorf("request %d: X-RateLimit-Limit %q -Remaining %q RateLimit-Policy %q; want %q, %s, %q", i, h["x-ratelimit-limit"], h["x-ratelimit-remaining"], h["ratelimit-policy"], wantLimit, remaining, wantPolicy)
		}
	}
}
