package httpapi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"net/http/httptest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// TestAdminAccess: POST /admin/reset answers loopback clients, and others
// only with the bearer token of the token file, read again when the file
// changes; a bad body is a 400.
func TestAdminAccess(t *testing.T) {
	svc := servetest.Service(t, explainConfig, service.Options{})
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	token, err := NewTokenFile(tokenPath)
	if err != nil {
		t.Fatal(err)
	}
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
		{"off loopback, not a bearer", token, "192.0.2.7:4000", "Basic s3cret", 401},
		{"off loopback, the token", token, "192.0.2.7:4000", "Bearer s3cret", 200},
	} {
		if code, text := post(tc.tf, tc.remote, tc.auth, body); code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, code, text, tc.want)
		}
	}
	if code, text := post(nil, "127.0.0.1:4000", "", `{"domain":`); code != 400 {
		t.Errorf("a bad body: %d %s, want 400", code, text)
	}

	// A rotated token applies at the next request; the old one no longer.
	if err := os.WriteFile(tokenPath, []byte("n3w-token-longer"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(tokenPath, time.Now().Add(time.Second), time.Now().Add(time.Second))
	if code, _ := post(token, "192.0.2.7:4000", "Bearer s3cret", body); code != 401 {
		t.Errorf("the old token after a rotation: %d, want 401", code)
	}
	if code, _ := post(token, "192.0.2.7:4000", "Bearer n3w-token-longer", body); code != 200 {
		t.Errorf("the new token after a rotation: %d, want 200", code)
	}
	// An emptied file refuses every token; a missing one too.
	os.WriteFile(tokenPath, nil, 0o600)
	if code, _ := post(token, "192.0.2.7:4000", "Bearer ", body); code != 401 {
		t.Errorf("an empty token file and an empty token: %d, want 401", code)
	}
	if _, err := NewTokenFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Errorf("NewTokenFile of a missing file: no error")
	}
}
