package ui_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/reloadlog"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/topkeys"
	"github.com/rlsproject/rls/internal/ui"
)

const limits = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, name: per_user}
  - key: tenant
    descriptors:
      - key: plan
        value: gold
        lease: true
        rate_limit: {unit: minute, requests_per_unit: 100}
`

// page is an API with the page on, over a service that has decided
// calls, as rls serve --ui wires it: it answers GET path from remote with
// the headers given.
func page(t *testing.T, requireToken bool) func(path, remote string, headers map[string]string) (int, string, map[string]string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	mem, err := overrides.NewMemory("", nil)
	if err != nil {
		t.Fatal(err)
	}
	keep := overrides.New(mem, overrides.Options{})
	if err := keep.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	top := topkeys.New(topkeys.Options{})
	loads := reloadlog.New(0, nil)
	svc := servetest.Service(t, limits, service.Options{Overrides: keep, Observers: []service.Observer{
		decisionmetrics.New(reg, decisionmetrics.Options{}), top, loads}})
	svc.Reload(func() (*config.Config, error) { return svc.Config(), nil })
	user := func(v string) *service.Request {
		return &service.Request{Domain: "api", Descriptors: []service.Descriptor{{Entries: []config.Entry{{Key: "user", Value: v}}}}}
	}
	for _, v := range []string{"alice", "alice", "alice", "<b>eve</b>", "<b>eve</b>", "<b>eve</b>"} {
		if _, err := svc.ShouldRateLimit(context.Background(), user(v)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := overrides.ParseChange([]byte(`{"domain":"api","descriptor":[{"key":"user","value":"bob"}],"requests_per_unit":50,"reason":"load test"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keep.Set(context.Background(), c, "test"); err != nil {
		t.Fatal(err)
	}
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	token, err := httpapi.NewTokenFile(tokenPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := httpapi.New(httpapi.Options{Service: svc, Gatherer: reg, Top: top, Overrides: keep, Reloads: loads.Loads, StoreName: "memory",
		AdminToken: token, RequireToken: requireToken, UI: func(api http.Handler) http.Handler { return ui.New(api) }})
	return func(path, remote string, headers map[string]string) (int, string, map[string]string) {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = remote
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		hs := map[string]string{}
		for k := range w.Header() {
			hs[k] = w.Header().Get(k)
		}
		return w.Code, w.Body.String(), hs
	}
}

// TestPageWithoutScript: GET /ui/ is the whole page rendered on the
// server from the endpoints, readable without JavaScript: every domain's
// limits with their flags, decisions and overrides in force, the top
// denied keys (request values escaped), the overrides, the config load
// with its changes, the store; with headers that keep other sites' pages
// and scripts out.
func TestPageWithoutScript(t *testing.T) {
	get := page(t, false)
	code, body, hs := get("/ui/", "127.0.0.1:5000", nil)
	if code != 200 {
		t.Fatalf("GET /ui/ = %d %s", code, body)
	}
	for _, want := range []string{
		`<span class="domain">api</span>`,
		`<td>per_user</td><td class="num">2 / 1h</td>`,             // label, limit per window
		`data-f="ok">4</td><td class="num" data-f="denied">2</td>`, // 2 keys: 2 admitted, 1 denied each
		`<span class="flag">lease</span>`,
		`user=bob → 50 (load test)`,
		`user=&lt;b&gt;eve&lt;/b&gt;`,
		`added</span> api per_user`,
		`memory: <span class="ok">answers</span>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /ui/ lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<b>eve</b>") {
		t.Errorf("GET /ui/ shows a request value unescaped")
	}
	if csp := hs["Content-Security-Policy"]; !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") || hs["X-Frame-Options"] != "DENY" {
		t.Errorf("GET /ui/ headers = %v, want a CSP of the page's own scripts, no framing", hs)
	}
	for _, tc := range []struct {
		path, remote string
		want         int
		has          string
	}{
		{"/ui/part/top", "127.0.0.1:5000", 200, "user=alice"},
		{"/ui/part/nothing", "127.0.0.1:5000", 404, ""},
		{"/ui/app.js", "127.0.0.1:5000", 200, "Authorization"},
		{"/ui/style.css", "127.0.0.1:5000", 200, "spark"},
		{"/ui/page.html", "127.0.0.1:5000", 404, ""},
		{"/ui/", "192.0.2.7:5000", 403, ""},
	} {
		code, body, _ := get(tc.path, tc.remote, nil)
		if code != tc.want || !strings.Contains(body, tc.has) {
			t.Errorf("GET %s from %s = %d (%d bytes), want %d with %q", tc.path, tc.remote, code, len(body), tc.want, tc.has)
		}
	}
}

// TestPageWithRequiredToken: under --admin-require-token the page's shell
// opens (it holds nothing), its views say the token is needed, and the
// same views come whole when the request carries the token.
func TestPageWithRequiredToken(t *testing.T) {
	get := page(t, true)
	code, body, _ := get("/ui/", "127.0.0.1:5000", nil)
	if code != 200 || !strings.Contains(body, "Not available: GET /debug/status: 401") || strings.Contains(body, "user=alice") {
		t.Errorf("GET /ui/ without the token = %d, want 200 with views that need it:\n%s", code, body)
	}
	code, body, _ = get("/ui/part/top", "127.0.0.1:5000", map[string]string{"Authorization": "Bearer s3cret"})
	if code != 200 || !strings.Contains(body, "user=alice") {
		t.Errorf("GET /ui/part/top with the token = %d, want the top keys:\n%s", code, body)
	}
}
