package httpapi

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// TestBrowserRequestsRefused: an admin request that a browser sends for
// another site's page (CSRF: Sec-Fetch-Site cross-site or same-site, an
// Origin other than the host) is refused even from loopback and with the
// token; a browser's request from loopback that names a host other than a
// loopback one (DNS rebinding) is refused unless it carries the token, on
// /admin/ and on /debug/; rls's own page (same origin, localhost) and
// programs that send no browser headers are served as before.
func TestBrowserRequestsRefused(t *testing.T) {
	svc := servetest.Service(t, explainConfig, service.Options{})
	token, _ := writeToken(t, "s3cret\n")
	h := New(Options{Service: svc, Gatherer: prometheus.NewRegistry(), AdminToken: token})
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`
	for i, tc := range []struct {
		method, path, host string
		headers            map[string]string
		want               int
	}{
		{"POST", "/admin/reset", "localhost:8080", nil, 200},
		{"POST", "/admin/reset", "rebound.example:8080", nil, 200}, // not a browser: as before
		{"POST", "/admin/reset", "localhost:8080", map[string]string{"Origin": "http://localhost:8080", "Sec-Fetch-Site": "same-origin"}, 200},
		{"POST", "/admin/reset", "127.0.0.1:8080", map[string]string{"Origin": "http://127.0.0.1:8080"}, 200},
		{"POST", "/admin/reset", "localhost:8080", map[string]string{"Origin": "https://evil.example"}, 403},
		{"POST", "/admin/reset", "localhost:8080", map[string]string{"Origin": "https://evil.example", "Authorization": "Bearer s3cret"}, 403},
		{"POST", "/admin/reset", "localhost:8080", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"POST", "/admin/reset", "localhost:8080", map[string]string{"Sec-Fetch-Site": "same-site"}, 403},
		{"POST", "/admin/reset", "localhost:8080", map[string]string{"Origin": "null"}, 403},
		{"POST", "/admin/reset", "rebound.example:8080", map[string]string{"Origin": "http://rebound.example:8080", "Sec-Fetch-Site": "same-origin"}, 401},
		{"POST", "/admin/reset", "rebound.example:8080", map[string]string{"Origin": "http://rebound.example:8080", "Authorization": "Bearer s3cret"}, 200},
		{"GET", "/debug/config", "rebound.example:8080", map[string]string{"Sec-Fetch-Site": "same-origin"}, 403},
		{"GET", "/debug/config", "[::1]:8080", map[string]string{"Sec-Fetch-Site": "same-origin"}, 200},
		{"GET", "/debug/config", "rebound.example:8080", nil, 200},
	} {
		r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(body))
		r.RemoteAddr, r.Host = "127.0.0.1:5000", tc.host
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("step %d: %s %s Host %s %v from loopback = %d %s, want %d", i, tc.method, tc.path, tc.host, tc.headers, w.Code, w.Body, tc.want)
		}
	}
}
