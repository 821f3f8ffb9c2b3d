package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

const limitsYAML = `
domain: web
http_descriptors:
  - actions: [{remote_address: {}}]
  - actions:
      - header_value_match: {descriptor_value: writes, headers: [{name: ":method", string_match: {exact: POST}}]}
      - request_headers: {header_name: ":path", descriptor_key: path}
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: minute, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 100}
  - key: header_match
    value: writes
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 1}
`

type fixture struct {
	srv *httptest.Server
	svc *service.Service
}

// newFixture serves New(opts) with a service on limitsYAML and store (a memory
// store at a fixed instant when nil).
func newFixture(t *testing.T, store engine.Store, opts Options) *fixture {
	t.Helper()
	reg := prometheus.NewRegistry()
	svc := servetest.Service(t, limitsYAML, service.Options{Store: store})
	opts.Service, opts.Gatherer = svc, reg
	srv := httptest.NewServer(New(opts))
	t.Cleanup(srv.Close)
	return &fixture{srv: srv, svc: svc}
}

func (f *fixture) do(t *testing.T, method, path string, headers map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestAuth(t *testing.T) {
	f := newFixture(t, nil, Options{})
	nginx := map[string]string{"X-Original-URI": "/page?x=1", "X-Original-Method": "GET", "X-Real-IP": "203.0.113.7"}
	for i := range 2 {
		resp, _ := f.do(t, "GET", "/auth/web", nginx, "")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d, want 200", i, resp.StatusCode)
		}
		if got := resp.Header.Get("X-RateLimit-Remaining"); got != []string{"1", "0"}[i] {
			t.Errorf("request %d: X-RateLimit-Remaining %q", i, got)
		}
		for _, h := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Reset"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("request %d: no %s header", i, h)
			}
		}
		if resp.Header.Get("Retry-After") != "" {
			t.Errorf("request %d: Retry-After on an allowed answer", i)
		}
	}
	resp, _ := f.do(t, "GET", "/auth/web", nginx, "")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "60" || resp.Header.Get("RateLimit") != `"remote_address/1m";r=0;t=60` {
		t.Errorf("third request: %d Retry-After %q RateLimit %q, want 429, 60, \"remote_address/1m\";r=0;t=60",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
	}
	resp, _ = f.do(t, "GET", "/auth/web?deny_status=403", nginx, "")
	if resp.StatusCode != 403 {
		t.Errorf("deny_status=403: %d", resp.StatusCode)
	}
	resp, _ = f.do(t, "GET", "/auth/web?deny_status=500", nginx, "")
	if resp.StatusCode != 400 {
		t.Errorf("deny_status=500: %d, want 400", resp.StatusCode)
	}
	// Another client address has its own budget.
	other := map[string]string{"X-Original-URI": "/page", "X-Real-IP": "203.0.113.8"}
	if resp, _ := f.do(t, "GET", "/auth/web", other, ""); resp.StatusCode != 200 {
		t.Errorf("another client: %d, want 200", resp.StatusCode)
	}
	if resp, _ := f.do(t, "GET", "/auth/nope", nginx, ""); resp.StatusCode != 404 {
		t.Errorf("unknown domain: %d, want 404", resp.StatusCode)
	}
}

func TestAuthOriginalMethodAndURI(t *testing.T) {
	f := newFixture(t, nil, Options{})
	// nginx sends the subrequest as GET; the original method is in a header.
	post := func(ip, uri string) int {
		resp, _ := f.do(t, "GET", "/auth/web", map[string]string{"X-Original-Method": "POST", "X-Original-URI": uri, "X-Real-IP": ip}, "")
		return resp.StatusCode
	}
	if got := post("192.0.2.1", "/orders"); got != 200 {
		t.Fatalf("first POST /orders: %d", got)
	}
	if got := post("192.0.2.2", "/orders"); got != 429 {
		t.Errorf("second POST /orders (1 per hour per path): %d, want 429", got)
	}
	if got := post("192.0.2.3", "/carts"); got != 200 {
		t.Errorf("POST /carts: %d, want 200", got)
	}
	// Traefik/Caddy style headers.
	resp, _ := f.do(t, "GET", "/auth/web", map[string]string{"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/carts", "X-Forwarded-For": "192.0.2.4, 10.0.0.1"}, "")
	if resp.StatusCode != 429 {
		t.Errorf("X-Forwarded-Method POST /carts after one: %d, want 429", resp.StatusCode)
	}
}

func TestAuthClientAddress(t *testing.T) {
	req := func(remote string, h map[string]string) *http.Request {
		r := httptest.NewRequest("GET", "/auth/web", nil)
		r.RemoteAddr = remote
		for k, v := range h {
			r.Header.Set(k, v)
		}
		return r
	}
	open := &handler{}
	strict := &handler{Options: Options{Auth: AuthOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}}
	for _, tc := range []struct {
		h    *handler
		r    *http.Request
		want string
	}{
		{open, req("10.0.0.1:5000", map[string]string{"X-Real-IP": "1.1.1.1", "X-Forwarded-For": "2.2.2.2"}), "1.1.1.1"},
		{open, req("10.0.0.1:5000", map[string]string{"X-Forwarded-For": "2.2.2.2, 10.0.0.3"}), "2.2.2.2"},
		{open, req("10.0.0.1:5000", nil), "10.0.0.1"},
		{strict, req("10.0.0.1:5000", map[string]string{"X-Forwarded-For": "6.6.6.6, 2.2.2.2, 10.0.0.3"}), "2.2.2.2"},
		{strict, req("198.51.100.1:5000", map[string]string{"X-Forwarded-For": "2.2.2.2", "X-Real-IP": "3.3.3.3"}), "198.51.100.1"},
		{strict, req("10.0.0.1:5000", map[string]string{"X-Real-IP": "3.3.3.3"}), "3.3.3.3"},
	} {
		if got := tc.h.clientAddr(tc.r); got.String() != tc.want {
			t.Errorf("clientAddr(peer %s, %v, trusted %v) = %s, want %s", tc.r.RemoteAddr, tc.r.Header, tc.h.Auth.TrustedProxies, got, tc.want)
		}
	}
}

type downStore struct{}

func (downStore) Apply(context.Context, []engine.Item, []engine.Result) (bool, error) {
	return false, errors.New("dial tcp 127.0.0.1:6379: connection refused")
}

func (s downStore) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	return s.Apply(ctx, items, results)
}
func (downStore) Ping(context.Context) error { return errors.New("connection refused") }
func (downStore) Reset(context.Context, []engine.Item) (int, error) {
	return 0, errors.New("connection refused")
}

func TestStoreDown(t *testing.T) {
	f := newFixture(t, downStore{}, Options{})
	if resp, _ := f.do(t, "GET", "/auth/web", map[string]string{"X-Real-IP": "192.0.2.1"}, ""); resp.StatusCode != 503 {
		t.Errorf("/auth with the store down: %d, want 503", resp.StatusCode)
	}
	if resp, body := f.do(t, "GET", "/readyz", nil, ""); resp.StatusCode != 503 || !strings.Contains(body, "connection refused") {
		t.Errorf("/readyz with the store down: %d %q, want 503 naming the cause", resp.StatusCode, body)
	}
	if resp, _ := f.do(t, "GET", "/healthz", nil, ""); resp.StatusCode != 200 {
		t.Errorf("/healthz with the store down: %d, want 200 (the process serves)", resp.StatusCode)
	}
}

// TestJSONMounted: /json is the handler given, for POST only.
func TestJSONMounted(t *testing.T) {
	f := newFixture(t, nil, Options{JSON: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "json handler")
	})})
	if resp, body := f.do(t, "POST", "/json", nil, "{}"); resp.StatusCode != 200 || body != "json handler" {
		t.Errorf("POST /json = %d %q, want the JSON handler's answer", resp.StatusCode, body)
	}
	if resp, _ := f.do(t, "GET", "/json", nil, ""); resp.StatusCode != 405 {
		t.Errorf("GET /json = %d, want 405", resp.StatusCode)
	}
	if resp, _ := newFixture(t, nil, Options{}).do(t, "POST", "/json", nil, "{}"); resp.StatusCode != 404 {
		t.Errorf("POST /json without a JSON handler = %d, want 404", resp.StatusCode)
	}
}

func TestDebugAccess(t *testing.T) {
	for _, tc := range []struct {
		access DebugAccess
		remote string
		want   int
	}{
		{DebugLoopback, "127.0.0.1:1", 200},
		{DebugLoopback, "[::1]:1", 200},
		{DebugLoopback, "192.0.2.1:1", 403},
		{DebugOn, "192.0.2.1:1", 200},
		{DebugOff, "127.0.0.1:1", 404},
	} {
		f := newFixture(t, nil, Options{Debug: tc.access})
		h := New(Options{Service: f.svc, Debug: tc.access, Gatherer: prometheus.NewRegistry()})
		r := httptest.NewRequest("GET", "/debug/config", nil)
		r.RemoteAddr = tc.remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("/debug/config with access %d from %s = %d, want %d", tc.access, tc.remote, w.Code, tc.want)
		}
		if w.Code == 200 && !strings.Contains(w.Body.String(), `"web"`) {
			t.Errorf("/debug/config body lacks the domain: %.200s", w.Body.String())
		}
	}
}

func FuzzAuthHeaders(f *testing.F) {
	h := &handler{Options: Options{Service: servetest.Service(f, limitsYAML, service.Options{})}}
	f.Add("POST", "/orders?x=1", "203.0.113.7", "1.1.1.1, 2.2.2.2", "web", "403")
	f.Add("", "", "", "", "web", "")
	f.Add("GET", "%zz\x00", "::ffff:1.2.3.4", ",,", "w%20b", "x")
	f.Fuzz(func(t *testing.T, method, uri, realIP, xff, domain, deny string) {
		r := httptest.NewRequest("GET", "/auth/web", nil)
		r.URL.RawQuery = "deny_status=" + deny
		r.SetPathValue("domain", domain)
		r.Header["X-Original-Method"] = []string{method}
		r.Header["X-Original-Uri"] = []string{uri}
		r.Header["X-Real-Ip"] = []string{realIP}
		r.Header["X-Forwarded-For"] = []string{xff}
		w := httptest.NewRecorder()
		h.auth(w, r)
		switch w.Code {
		case 200, 400, 401, 403, 404, 429:
		default:
			t.Fatalf("/auth answered %d", w.Code)
		}
	})
}
