package httpapi

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/topkeys"
)

const topConfig = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1, name: per_user}
`

// getTop serves GET path from remote with the top keys of a service that
// decided reqs.
func getTop(t *testing.T, access DebugAccess, remote, path string, reqs ...*service.Request) (int, string) {
	t.Helper()
	keys := topkeys.New(topkeys.Options{Now: storetest.NewClock(storetest.T0).Now})
	store := servetest.MemoryStore(t, nil)
	svc := servetest.Service(t, topConfig, service.Options{Store: store, Observers: []service.Observer{keys}})
	for _, r := range reqs {
		if _, err := svc.ShouldRateLimit(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	h := New(Options{Service: svc, Debug: access, Gatherer: prometheus.NewRegistry(), Top: keys})
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

func req(domain string, kv ...string) *service.Request {
	var d service.Descriptor
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &service.Request{Domain: domain, Descriptors: []service.Descriptor{d}}
}

// TestDebugTop: GET /debug/top gives each limit of the domain with its
// keys heaviest first, in the contract's shape, with the request and the
// command lines for each key; name, by and n select; a bad query is 400;
// /debug/'s access rules apply.
func TestDebugTop(t *testing.T) {
	var reqs []*service.Request
	for range 5 {
		reqs = append(reqs, req("api", "remote_address", "203.0.113.7"))
	}
	reqs = append(reqs, req("api", "remote_address", "it's me"), req("api", "remote_address", "it's me"), req("api", "remote_address", "it's me"),
		req("api", "tenant", "acme", "user", "u1"), req("api", "tenant", "acme", "user", "u1"))
	code, body := getTop(t, DebugLoopback, "127.0.0.1:5000", "/debug/top?domain=api", reqs...)
	if code != 200 {
		t.Fatalf("GET /debug/top = %d %s", code, body)
	}
	var res TopResult
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatal(err)
	}
	if res.Processes != 1 || res.By != "denied" || len(res.Limits) != 2 {
		t.Fatalf("GET /debug/top: %s\nwant 2 limits of 1 process, by denied", body)
	}
	l := res.Limits[0]
	if l.Domain != "api" || l.Name != "remote_address/1h" || len(l.Descriptor) != 1 || l.Descriptor[0] != (EntryJSON{"remote_address", ""}) || l.Denials != 4 || len(l.Keys) != 2 {
		t.Fatalf("limit 0: %+v", l)
	}
	k := l.Keys[0]
	if k.Descriptor[0].Value != "203.0.113.7" || k.Denied != 3 || k.Admitted != 2 || k.Fullness != 1 || k.Error != 0 {
		t.Errorf("key 0: %+v, want 203.0.113.7 denied 3, admitted 2, full", k)
	}
	if k.Commands == nil || k.Commands.Reset != "rls reset api remote_address=203.0.113.7" || k.Commands.Explain != "rls explain api remote_address=203.0.113.7" ||
		!strings.HasPrefix(k.Commands.Override, "rls override set api remote_address=203.0.113.7 --requests-per-unit 0 --ttl 1h") {
		t.Errorf("key 0 commands: %+v", k.Commands)
	}
	if k.Request == nil || k.Request.Domain != "api" || k.Request.Descriptors[0].Entries[0].Value != "203.0.113.7" {
		t.Errorf("key 0 request: %+v", k.Request)
	}
	if c := l.Keys[1].Commands; c == nil || c.Reset != `rls reset api 'remote_address=it'\''s me'` {
		t.Errorf("key 1 commands: %+v, want its value quoted for a shell", c)
	}
	u := res.Limits[1]
	if u.Name != "per_user" || len(u.Keys) != 1 || u.Keys[0].Commands.Reset != "rls reset api tenant=acme,user=u1" ||
		!strings.Contains(u.Keys[0].Commands.Override, "rls override set api tenant=acme user=u1 --name per_user ") {
		t.Errorf("limit 1: %+v", u)
	}
	if !strings.Contains(body, `"denied": 3`) || !strings.Contains(body, `"admitted": 2`) || !strings.Contains(body, `"fullness": 1`) || !strings.Contains(body, `"processes": 1`) {
		t.Errorf("the JSON lacks a field of the contract:\n%s", body)
	}

	code, body = getTop(t, DebugLoopback, "127.0.0.1:5000", "/debug/top?domain=api&name=per_user&by=fullness&n=1", reqs...)
	if err := json.Unmarshal([]byte(body), &res); err != nil || code != 200 || len(res.Limits) != 1 || res.By != "fullness" || len(res.Limits[0].Keys) != 1 {
		t.Errorf("GET /debug/top?name=per_user&by=fullness&n=1 = %d %s", code, body)
	}
	for _, bad := range []string{"/debug/top?by=loudest", "/debug/top?n=0", "/debug/top?n=x", "/debug/top?n=100000"} {
		if code, body := getTop(t, DebugLoopback, "127.0.0.1:5000", bad); code != 400 {
			t.Errorf("GET %s = %d %s, want 400", bad, code, body)
		}
	}
	if code, _ := getTop(t, DebugLoopback, "192.0.2.1:5000", "/debug/top"); code != 403 {
		t.Errorf("GET /debug/top from off loopback = %d, want 403 (--debug-endpoints loopback)", code)
	}
	if code, _ := getTop(t, DebugOff, "127.0.0.1:5000", "/debug/top"); code != 404 {
		t.Errorf("GET /debug/top with debug endpoints off = %d, want 404", code)
	}
}
