package httpapi

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

var update = flag.Bool("update", false, "rewrite testdata/results.golden from what the code writes")

// resultsConfig has a limit of every kind that an explanation writes.
const resultsConfig = `
domain: api
http_descriptors:
  - actions: [{remote_address: {}}]
  - actions:
      - request_headers: {header_name: x-api-key, descriptor_key: api_key}
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: minute, requests_per_unit: 2}
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 8, name: bucket}
      - {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: login
    rate_limit: {unit: minute, requests_per_unit: 1, penalty: [2m, 10m], penalty_reset: 24h}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 1000, calendar: true}
  - key: job
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: concurrency, lease_ttl: 45s}
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 3, name: per_key}
  - key: plan
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 30, name: gold, replaces: [{name: per_key}]}
  - key: tenant
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: org
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 10}
      - key: team
        value: "a*"
        rate_limit: {unit: hour, requests_per_unit: 10}
---
domain: web
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
`

// TestResultsGolden: what POST /debug/explain and POST /admin/reset write,
// byte for byte, for requests that reach every field: matches and every
// way a match stops, each kind of limit with its state, a penalty's block,
// shadow, unlimited, replaced, overrides, quota groups, the HTTP form, an
// unknown domain, a failing store, and resets. The golden file was
// written by the code that wrote the JSON from the service's own types,
// before it moved to this package.
func TestResultsGolden(t *testing.T) {
	clock := storetest.NewClock(time.Date(2024, 2, 10, 12, 0, 30, 0, time.UTC))
	svc := servetest.Service(t, resultsConfig, service.Options{Store: servetest.MemoryStore(t, clock.Now), Now: clock.Now})
	down := servetest.Service(t, resultsConfig, service.Options{Store: downStore{}, Now: clock.Now})
	ask := func(body string) {
		t.Helper()
		req, err := envoyrls.DecodeJSON([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		svc.ShouldRateLimit(context.Background(), req)
	}
	// State to explain: a spent minute, a login blocked by its penalty, a
	// spent quota group, a shadow limit over.
	for range 3 {
		ask(`{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`)
		ask(`{"domain":"api","descriptors":[{"entries":[{"key":"login","value":"u"}]}]}`)
		ask(`{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"t"}]}]}`)
	}
	ask(`{"domain":"api","descriptors":[{"entries":[{"key":"quota","value":"q1"}]}]}`)

	var out bytes.Buffer
	for _, tc := range []struct {
		svc  *service.Service
		path string
		body string
	}{
		{svc, "/debug/explain", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`},
		{svc, "/debug/explain", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.2"}],"hits_addend":9}]}`},
		{svc, "/debug/explain", `{"domain":"api","descriptors":[{"entries":[{"key":"login","value":"u"}]},{"entries":[{"key":"month","value":"m"}]},{"entries":[{"key":"job","value":"j"}]}]}`},
		{svc, "/debug/explain", `{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k"}]},{"entries":[{"key":"plan","value":"gold"}]},{"entries":[{"key":"api_key","value":"internal"}]}]}`},
		{svc, "/debug/explain", `{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"t"}]},{"entries":[{"key":"quota","value":"q1"}]},{"entries":[{"key":"quota","value":"q2"}]}]}`},
		{svc, "/debug/explain", `{"domain":"api","hits_addend":2,"descriptors":[{"entries":[{"key":"job","value":"j"}],"limit":{"requests_per_unit":7,"unit":"MINUTE"}},{"entries":[{"key":"remote_address","value":"10.0.0.3"}],"hits_addend":1,"is_negative_hits":true}]}`},
		{svc, "/debug/explain", `{"domain":"api","descriptors":[{"entries":[{"key":"org","value":"o"}]},{"entries":[{"key":"org","value":"o"},{"key":"plan","value":"free"}]},{"entries":[{"key":"org","value":"o"},{"key":"team","value":"ab"}]},{"entries":[{"key":"nope","value":"x"}]},{"entries":[{"key":"login","value":"u"},{"key":"deeper","value":"x"}]}]}`},
		{svc, "/debug/explain", `{"domain":"apx","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`},
		{svc, "/debug/explain", `{"domain":"api","http":{"method":"GET","path":"/","client_address":"203.0.113.7"}}`},
		{svc, "/debug/explain", `{"domain":"api","http":{"method":"GET","path":"/","headers":{"X-Api-Key":"internal"},"client_address":"203.0.113.7:5555"}}`},
		{svc, "/debug/explain", `{"domain":"nope","http":{"method":"GET","path":"/"}}`},
		{down, "/debug/explain", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]},{"entries":[{"key":"api_key","value":"internal"}]}]}`},
		{svc, "/admin/reset", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]},{"entries":[{"key":"nope","value":"x"}]},{"entries":[{"key":"api_key","value":"k"}]},{"entries":[{"key":"plan","value":"gold"}]}]}`},
		{svc, "/admin/reset", `{"domain":"apx","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`},
		{svc, "/debug/explain", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`},
	} {
		h := New(Options{Service: tc.svc, Debug: DebugLoopback, Gatherer: prometheus.NewRegistry()})
		r := httptest.NewRequest("POST", tc.path, strings.NewReader(tc.body))
		r.RemoteAddr = "127.0.0.1:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Fprintf(&out, "POST %s %s\n%d\n%s\n", tc.path, tc.body, w.Code, w.Body.String())
	}
	const golden = "testdata/results.golden"
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("the answers differ from %s (go test -update rewrites it):\n%s", golden, out.String())
	}
}
