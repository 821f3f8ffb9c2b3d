package httpapi

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// writeToken writes a token file of content in a new directory and
// returns its TokenFile.
func writeToken(t *testing.T, content string) (*TokenFile, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	tf, err := NewTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tf, path
}

// TestAdminAccess: POST /admin/reset answers loopback clients, and others
// only with the bearer token of the token file, the scheme in any case; a
// token file rotated applies at the next check; a bad body is a 400.
func TestAdminAccess(t *testing.T) {
	svc := servetest.Service(t, explainConfig, service.Options{})
	token, tokenPath := writeToken(t, "s3cret\n")
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`
	post := func(tf *TokenFile, remote, auth, body string) (int, string) {
		h := New(Options{Service: svc, Gatherer: prometheus.NewRegistry(), AdminToken: tf})
		r := httptest.NewRequest("POST", "/admin/reset", strings.NewReader(body))
		r.RemoteAddr = remote
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	for _, tc := range []struct {
		name         string
		tf           *TokenFile
		remote, auth string
		want         int
	}{
		{"loopback, no token file", nil, "127.0.0.1:4000", "", 200},
		{"loopback IPv6", nil, "[::1]:4000", "", 200},
		{"off loopback, no token file", nil, "192.0.2.7:4000", "Bearer s3cret", 403},
		{"off loopback, no token", token, "192.0.2.7:4000", "", 401},
		{"off loopback, wrong token", token, "192.0.2.7:4000", "Bearer s3cre", 401},
		{"off loopback, a longer token", token, "192.0.2.7:4000", "Bearer s3crets", 401},
		{"off loopback, not a bearer", token, "192.0.2.7:4000", "Basic s3cret", 401},
		{"off loopback, the token", token, "192.0.2.7:4000", "Bearer s3cret", 200},
		{"off loopback, the token, scheme in lower case", token, "192.0.2.7:4000", "bearer s3cret", 200},
		{"off loopback, the token, scheme in upper case", token, "192.0.2.7:4000", "BEARER s3cret", 200},
	} {
		if code, text := post(tc.tf, tc.remote, tc.auth, body); code != tc.want {
			t.Errorf("%s: POST /admin/reset from %s with %q = %d %s, want %d", tc.name, tc.remote, tc.auth, code, text, tc.want)
		}
	}
	if code, text := post(nil, "127.0.0.1:4000", "", `{"domain":`); code != 400 {
		t.Errorf("a bad body: %d %s, want 400", code, text)
	}

	// A rotated token applies at the next check; the old one no longer.
	if err := os.WriteFile(tokenPath, []byte("n3w-token-longer"), 0o600); err != nil {
		t.Fatal(err)
	}
	token.Check(time.Now())
	if code, _ := post(token, "192.0.2.7:4000", "Bearer s3cret", body); code != 401 {
		t.Errorf("the old token after a rotation: %d, want 401", code)
	}
	if code, _ := post(token, "192.0.2.7:4000", "Bearer n3w-token-longer", body); code != 200 {
		t.Errorf("the new token after a rotation: %d, want 200", code)
	}
	// An emptied file refuses every token.
	os.WriteFile(tokenPath, nil, 0o600)
	token.Check(time.Now())
	for _, auth := range []string{"Bearer ", "Bearer n3w-token-longer"} {
		if code, _ := post(token, "192.0.2.7:4000", auth, body); code != 401 {
			t.Errorf("an empty token file and %q: %d, want 401", auth, code)
		}
	}
}

// TestRequireTokenFromLoopback: with RequireToken (--admin-require-token)
// every /admin/ and /debug/ endpoint wants the bearer token from loopback
// clients too; --debug-endpoints still says who may ask /debug/ at all;
// the other endpoints are as open as before. Without the switch, loopback
// clients need no token (the default, unchanged).
func TestRequireTokenFromLoopback(t *testing.T) {
	svc := servetest.Service(t, explainConfig, service.Options{})
	token, _ := writeToken(t, "s3cret\n")
	reset := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`
	type req struct{ method, path, body string }
	guarded := []req{
		{"POST", "/admin/reset", reset},
		{"GET", "/debug/config", ""},
		{"POST", "/debug/explain", reset},
		{"GET", "/debug/pprof/", ""},
		{"GET", "/debug/pprof/cmdline", ""},
		{"GET", "/debug/pprof/symbol", ""},
	}
	open := []req{{"GET", "/healthz", ""}, {"GET", "/metrics", ""}}
	const loop, far = "127.0.0.1:4000", "192.0.2.7:4000"
	for _, tc := range []struct {
		name    string
		require bool
		tf      *TokenFile
		debug   DebugAccess
		remote  string
		auth    string
		admin   int // /admin/reset's status
		debugs  int // each /debug/ endpoint's
	}{
		{"default: loopback, no token", false, token, DebugLoopback, loop, "", 200, 200},
		{"default: off loopback, the token", false, token, DebugLoopback, far, "Bearer s3cret", 200, 403},
		{"required: loopback, no token", true, token, DebugLoopback, loop, "", 401, 401},
		{"required: loopback, wrong token", true, token, DebugLoopback, loop, "Bearer nope", 401, 401},
		{"required: loopback, the token", true, token, DebugLoopback, loop, "Bearer s3cret", 200, 200},
		{"required: IPv6 loopback, no token", true, token, DebugLoopback, "[::1]:4000", "", 401, 401},
		{"required: off loopback, the token, debug loopback only", true, token, DebugLoopback, far, "bearer s3cret", 200, 403},
		{"required: debug on, off loopback, no token", true, token, DebugOn, far, "", 401, 401},
		{"required: debug on, off loopback, the token", true, token, DebugOn, far, "Bearer s3cret", 200, 200},
		{"required: debug off", true, token, DebugOff, loop, "Bearer s3cret", 200, 404},
		{"required, no token file: everything refused", true, nil, DebugOn, loop, "Bearer s3cret", 403, 403},
	} {
		h := New(Options{Service: svc, Gatherer: prometheus.NewRegistry(), AdminToken: token, RequireToken: tc.require, Debug: tc.debug})
		if tc.tf == nil {
			h = New(Options{Service: svc, Gatherer: prometheus.NewRegistry(), RequireToken: tc.require, Debug: tc.debug})
		}
		do := func(q req) int {
			r := httptest.NewRequest(q.method, q.path, strings.NewReader(q.body))
			r.RemoteAddr = tc.remote
			if tc.auth != "" {
				r.Header.Set("Authorization", tc.auth)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w.Code
		}
		for _, q := range guarded {
			want := tc.debugs
			if strings.HasPrefix(q.path, "/admin/") {
				want = tc.admin
			}
			if got := do(q); got != want {
				t.Errorf("%s: %s %s from %s with %q = %d, want %d", tc.name, q.method, q.path, tc.remote, tc.auth, got, want)
			}
		}
		for _, q := range open {
			if got := do(q); got != 200 {
				t.Errorf("%s: %s %s from %s = %d, want 200 (not guarded)", tc.name, q.method, q.path, tc.remote, got)
			}
		}
	}
}

// TestMissingTokenFileRequestsLogBounded: while the token file is
// missing, requests that need the token are refused (401) and log no
// error of their own: 100 of them leave a rate-limited warning (one a
// second), no error.
func TestMissingTokenFileRequestsLogBounded(t *testing.T) {
	svc := servetest.Service(t, explainConfig, service.Options{})
	token, path := writeToken(t, "s3cret\n")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	token.Check(time.Now())
	var logs bytes.Buffer
	h := New(Options{Service: svc, Gatherer: prometheus.NewRegistry(), AdminToken: token, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for i := range 100 {
		r := httptest.NewRequest("POST", "/admin/reset", strings.NewReader(`{}`))
		r.RemoteAddr = "192.0.2.7:4000"
		r.Header.Set("Authorization", "Bearer s3cret")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 401 {
			t.Fatalf("request %d with the token file missing: %d, want 401", i, w.Code)
		}
	}
	if n := strings.Count(logs.String(), "\n"); n >= 10 || strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("100 refused requests logged %d lines, want a rate-limited warning and no error:\n%s", n, logs.String())
	}
}
