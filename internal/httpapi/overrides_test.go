package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// overridesHandler is the HTTP API of a service on explainConfig with a
// keeper of overrides in memory, and the keeper.
func overridesHandler(t *testing.T, token *TokenFile, b overrides.Backend) (*overrides.Keeper, func(method, path, remote, auth, body string) (int, string)) {
	t.Helper()
	if b == nil {
		m, err := overrides.NewMemory("", nil)
		if err != nil {
			t.Fatal(err)
		}
		b = m
	}
	keep := overrides.New(b, overrides.Options{})
	if err := keep.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	svc := servetest.Service(t, explainConfig, service.Options{Overrides: keep})
	h := New(Options{Service: svc, Gatherer: prometheus.NewRegistry(), AdminToken: token, Overrides: keep})
	return keep, func(method, path, remote, auth, body string) (int, string) {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.RemoteAddr = remote
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
}

// TestOverridesEndpoints: PUT, GET and DELETE /admin/overrides as the
// design says them: 200 and the override stored (expires_at with a ttl),
// 400 naming the field of a bad body, 400 saying why for one that matches
// no limit, 404 for a delete of none; access as /admin/reset; the
// explanation of a request carries "override" on the limit in force;
// /debug/config lists them.
func TestOverridesEndpoints(t *testing.T) {
	token, _ := writeToken(t, "s3cret\n")
	_, call := overridesHandler(t, token, nil)
	const lo = "127.0.0.1:4000"
	const set = `{"domain":"api","descriptor":[{"key":"remote_address","value":"10.0.0.*"}],"requests_per_unit":50,"ttl":"2h","reason":"migration"}`
	for i, tc := range []struct {
		method, path, remote, auth, body string
		want                             int
		says                             string // in the answer
	}{
		{"PUT", "/admin/overrides", lo, "", set, 200, `"expires_at"`},
		{"PUT", "/admin/overrides", lo, "", set, 200, `"requests_per_unit": 50`}, // the same key again replaces it
		{"PUT", "/admin/overrides", "192.0.2.7:4000", "", set, 401, "bearer token"},
		{"PUT", "/admin/overrides", "192.0.2.7:4000", "Bearer s3cret", set, 200, `"reason": "migration"`},
		{"GET", "/admin/overrides", "192.0.2.7:4000", "", "", 401, "bearer token"},
		{"PUT", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[{"key":"remote_address","value":"1"}]}`, 400, "requests_per_unit: is required"},
		{"PUT", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[{"key":"remote_address","value":"1"}],"requests_per_unit":-1}`, 400, "requests_per_unit: want uint32"},
		{"PUT", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[{"key":"remote_address","value":"1"}],"requests_per_unit":1,"ttl":"soon"}`, 400, `ttl: "soon" is not a duration`},
		{"PUT", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[],"requests_per_unit":1}`, 400, "descriptor: must not be empty"},
		{"PUT", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[{"key":"remote_address","value":"1"}],"requests_per_unit":1,"limit":3}`, 400, `limit: unknown field`},
		{"PUT", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[{"key":"tenant","value":"t1"}],"requests_per_unit":1}`, 400, "matches no limit of the loaded config: descriptor tenant=t1 reaches tenant, which has no limit that counts"},
		{"PUT", "/admin/overrides", lo, "", `{"domain":"nope","descriptor":[{"key":"k","value":"v"}],"requests_per_unit":1}`, 400, `no domain "nope"`},
		{"PUT", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[{"key":"tenant","value":"t1"},{"key":"plan","value":"gold"}],"requests_per_unit":1000}`, 200, `"tenant/plan=gold/1h"`},
		{"GET", "/admin/overrides", lo, "", "", 200, `"plan"`},
		{"GET", "/admin/overrides?domain=other", lo, "", "", 200, `"overrides": []`},
		{"DELETE", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[{"key":"tenant","value":"t1"},{"key":"plan","value":"gold"}]}`, 200, `"requests_per_unit": 1000`},
		{"DELETE", "/admin/overrides", lo, "", `{"domain":"api","descriptor":[{"key":"tenant","value":"t1"},{"key":"plan","value":"gold"}]}`, 404, "no such override"},
		{"DELETE", "/admin/overrides", lo, "", `{"domain":"api"}`, 400, "descriptor: is required"},
	} {
		code, body := call(tc.method, tc.path, tc.remote, tc.auth, tc.body)
		if code != tc.want || !strings.Contains(body, tc.says) {
			t.Errorf("step %d: %s %s from %s: %d %s\nwant %d saying %q", i+1, tc.method, tc.path, tc.remote, code, body, tc.want, tc.says)
		}
	}
	var list overridesList
	if _, body := call("GET", "/admin/overrides?domain=api", lo, "", ""); json.Unmarshal([]byte(body), &list) != nil || len(list.Overrides) != 1 {
		t.Fatalf("GET ?domain=api: %s, want one override", body)
	}
	if o := list.Overrides[0]; !o.Active || o.ExpiresAt == nil || time.Until(*o.ExpiresAt) < time.Hour || o.Limits[0] != "remote_address/1m" {
		t.Errorf("listed: %+v, want active on remote_address/1m, expiring in 2h", o)
	}
	// /debug/explain: the limit in force carries the override.
	code, body := call("POST", "/debug/explain", lo, "", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.7"}]}]}`)
	var ex Explanation
	if code != 200 || json.Unmarshal([]byte(body), &ex) != nil {
		t.Fatalf("explain: %d %s", code, body)
	}
	l := ex.Descriptors[0].Limits[0]
	if l.Override == nil || l.RequestsPerUnit != 50 || l.Override.Configured.RequestsPerUnit != 2 || l.Override.Reason != "migration" {
		t.Errorf("explain's limit: %+v override %+v; want 50 by the override of the configured 2", l, l.Override)
	}
	// /debug/config lists them.
	if code, body := call("GET", "/debug/config", lo, "", ""); code != 200 || !strings.Contains(body, `"overrides": [`) || !strings.Contains(body, `"10.0.0.*"`) {
		t.Errorf("/debug/config: %d, want the overrides listed:\n%s", code, body)
	}
}

// down is an overrides backend that cannot be read.
type down struct{ overrides.Backend }

func (down) Poll(context.Context) (uint64, time.Time, error) {
	return 0, time.Time{}, errors.New("connection refused")
}

func (down) Load(context.Context) (map[string][]byte, uint64, error) {
	return nil, 0, errors.New("connection refused")
}

// TestReadyzSaysOverridesStale: a process that cannot read the overrides
// stays ready (it decides with its last copy) and /readyz says so.
func TestReadyzSaysOverridesStale(t *testing.T) {
	m, err := overrides.NewMemory("", nil)
	if err != nil {
		t.Fatal(err)
	}
	fb := &down{m}
	keep := overrides.New(fb, overrides.Options{})
	keep.Load(context.Background())
	svc := servetest.Service(t, explainConfig, service.Options{Overrides: keep})
	h := New(Options{Service: svc, Gatherer: prometheus.NewRegistry(), Overrides: keep})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	if w.Code != 200 || !strings.Contains(w.Body.String(), "overrides: stale") || !strings.Contains(w.Body.String(), "connection refused") {
		t.Errorf("/readyz: %d %q; want 200 saying the overrides are stale and why", w.Code, w.Body.String())
	}
}
