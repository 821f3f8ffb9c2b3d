// Package nginx_test proves nginx/nginx.conf: it runs that file with the
// real nginx binary in front of rls (built from the sources as they are, once
// for every package of the run: proctest.RLS) and a Go backend, all on
// 127.0.0.1, and checks what clients get. The file is used as shipped except
// for the rows of confEdits (addresses, and the commented lines that a test
// enables); every row must match exactly once, so the test breaks when the
// example changes shape instead of silently testing something else. nginx is
// started the way the README's try-it block starts it: a scratch prefix
// (-p) for its logs and temporary files, the file by absolute path (-c), the
// pid file in -g.
package nginx_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/proctest"
)

// The files a stack runs.
const (
	exampleConf   = "nginx.conf"            // the file under test
	testLimits    = "testdata/limits.yaml"  // remote_address 5/h, api_key 3/h, POST 2/h, one host 1/h
	shippedLimits = "../config/limits.yaml" // the example `make run` serves
)

// Client addresses, sent as X-Forwarded-For from 127.0.0.1, which realip
// trusts in the tests.
const (
	clientA   = "203.0.113.1"
	clientB   = "203.0.113.2"
	clientC   = "203.0.113.3"
	forgedHop = "198.51.100.66" // what a client writes to pass as someone else
)

// What rls and nginx.conf answer with testdata/limits.yaml.
const (
	hourSeconds   = 3600                  // the window of every limit
	remoteLabel   = `"remote_address/1h"` // limit labels in RateLimit headers
	apiKeyLabel   = `"api_key/1h"`
	postLabel     = `"generic_key=writes/header_match=post/1h"`
	wantJSONError = "rate_limited" // "error" in @ratelimited's body
)

// stack is one nginx in front of one rls and one backend.
type stack struct {
	rls     *rlsProc
	backend *backend
	nginx   *proctest.Proc
	base    string // http://127.0.0.1:port of nginx
	client  *http.Client
}

type stackOpts struct {
	limits   string   // rls --config
	rlsFlags []string // more rls serve flags
	failOpen bool     // enable the commented fail-open line
}

func startStack(t *testing.T, o stackOpts) *stack {
	t.Helper()
	nginxBin := findNginx(t)
	s := &stack{backend: startBackend(t)}
	s.rls = startRLS(t, o.limits, "", o.rlsFlags...)
	s.nginx, s.base = startNginx(t, nginxBin, s.rls.addr, s.backend.addr(), o.failOpen)
	tr := &http.Transport{}
	s.client = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return s
}

func findNginx(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	const debian = "/usr/sbin/nginx" // not on a non-root PATH
	if _, err := os.Stat(debian); err == nil {
		return debian
	}
	t.Fatal("nginx not found: install it (apt-get install -y nginx); make test does this")
	return ""
}

// request is what a client sends to nginx.
type request struct {
	method  string // default GET
	path    string // default /
	xff     string // X-Forwarded-For: the client address realip takes
	apiKey  string // x-api-key
	realIP  string // X-Real-IP sent by the client (which must not count)
	host    string // Host; default nginx's host:port
	fwdHost string // X-Forwarded-Host sent by the client (which must not count)
	body    string
	comment string // why the step is there, for messages
}

func (r request) String() string {
	m := r.method
	if m == "" {
		m = http.MethodGet
	}
	s := m + " " + r.path
	if r.path == "" {
		s += "/"
	}
	if r.xff != "" {
		s += " from " + r.xff
	}
	if r.apiKey != "" {
		s += " key=" + r.apiKey
	}
	if r.realIP != "" {
		s += " X-Real-IP=" + r.realIP
	}
	if r.host != "" {
		s += " Host=" + r.host
	}
	if r.fwdHost != "" {
		s += " X-Forwarded-Host=" + r.fwdHost
	}
	if r.comment != "" {
		s += " (" + r.comment + ")"
	}
	return s
}

type response struct {
	status int
	header http.Header
	body   string
}

func (s *stack) do(t *testing.T, r request) response {
	t.Helper()
	method, path := r.method, r.path
	if method == "" {
		method = http.MethodGet
	}
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequestWithContext(t.Context(), method, s.base+path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if r.xff != "" {
		req.Header.Set("X-Forwarded-For", r.xff)
	}
	if r.apiKey != "" {
		req.Header.Set("X-Api-Key", r.apiKey)
	}
	if r.realIP != "" {
		req.Header.Set("X-Real-IP", r.realIP)
	}
	if r.host != "" {
		req.Host = r.host
	}
	if r.fwdHost != "" {
		req.Header.Set("X-Forwarded-Host", r.fwdHost)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: reading body: %v", r, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// step is one request of a timeline and what it must get.
type step struct {
	request
	wantStatus    int
	wantRemaining string // X-RateLimit-Remaining; "" = absent
	wantBackend   bool   // the backend saw the request
}

// run plays steps in order and checks status, remaining budget, and whether
// the backend was reached. It returns the responses for further checks.
func (s *stack) run(t *testing.T, steps []step) []response {
	t.Helper()
	out := make([]response, len(steps))
	for i, st := range steps {
		before := s.backend.count()
		got := s.do(t, st.request)
		out[i] = got
		if got.status != st.wantStatus {
			t.Errorf("step %d: %s = %d, want %d (body %q)", i+1, st.request, got.status, st.wantStatus, got.body)
		}
		if rem := got.header.Get("X-RateLimit-Remaining"); rem != st.wantRemaining {
			t.Errorf("step %d: %s: X-RateLimit-Remaining = %q, want %q", i+1, st.request, rem, st.wantRemaining)
		}
		if reached := s.backend.count() > before; reached != st.wantBackend {
			t.Errorf("step %d: %s: backend reached = %v, want %v", i+1, st.request, reached, st.wantBackend)
		}
	}
	return out
}

// TestAllowed: an admitted request reaches the backend, and the client gets
// the backend's answer with every rate-limit header rls sent to nginx.
func TestAllowed(t *testing.T) {
	s := startStack(t, stackOpts{limits: testLimits})
	got := s.run(t, []step{
		{request: request{path: "/hello?x=1", xff: clientA}, wantStatus: 200, wantRemaining: "4", wantBackend: true},
	})[0]
	if want := "backend: GET /hello?x=1"; !strings.HasPrefix(got.body, want) {
		t.Errorf("GET /hello?x=1: body = %q, want the backend's %q...", got.body, want)
	}
	for _, h := range []struct{ name, want string }{
		{"X-RateLimit-Limit", "5, 5;w=3600"},
		{"X-RateLimit-Remaining", "4"},
		{"X-RateLimit-Reset", strconv.Itoa(hourSeconds)},
		{"RateLimit", remoteLabel + ";r=4;t=3600"},
		{"RateLimit-Policy", remoteLabel + ";q=5;w=3600"},
		{"Retry-After", ""},
	} {
		if v := got.header.Get(h.name); v != h.want {
			t.Errorf("GET /hello?x=1: %s = %q, want %q", h.name, v, h.want)
		}
	}
	// What the backend was told about the client.
	if hit := s.backend.last(); hit.realIP != clientA {
		t.Errorf("backend saw X-Real-IP %q, want %q", hit.realIP, clientA)
	}
}

// TestOverLimit: past the limit the client gets nginx's 429 with Retry-After
// and the JSON body, and the backend is not reached.
func TestOverLimit(t *testing.T) {
	s := startStack(t, stackOpts{limits: testLimits})
	var steps []step
	for i := 4; i >= 0; i-- {
		steps = append(steps, step{request: request{xff: clientA}, wantStatus: 200, wantRemaining: strconv.Itoa(i), wantBackend: true})
	}
	steps = append(steps,
		step{request: request{xff: clientA, comment: "6th: over 5/h"}, wantStatus: 429, wantRemaining: "0"},
		step{request: request{xff: clientA, method: http.MethodPost, body: "x", comment: "still over"}, wantStatus: 429, wantRemaining: "0"},
	)
	resps := s.run(t, steps)
	if n := s.backend.count(); n != 5 {
		t.Errorf("backend hits = %d, want 5", n)
	}
	denied := resps[5]
	ra, err := strconv.Atoi(denied.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > hourSeconds {
		t.Errorf("429: Retry-After = %q, want whole seconds in [1, %d]", denied.header.Get("Retry-After"), hourSeconds)
	}
	for _, h := range []struct{ name, want string }{
		{"Content-Type", "application/json"},
		{"Cache-Control", "no-store"},
		{"X-RateLimit-Limit", "5, 5;w=3600"},
		{"RateLimit", remoteLabel + ";r=0;t=" + denied.header.Get("Retry-After")},
		{"RateLimit-Policy", remoteLabel + ";q=5;w=3600"},
	} {
		if v := denied.header.Get(h.name); v != h.want {
			t.Errorf("429: %s = %q, want %q", h.name, v, h.want)
		}
	}
	var body struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(denied.body), &body); err != nil || body.Error != wantJSONError || body.Message == "" {
		t.Errorf("429: body %q = %+v (err %v), want JSON with error %q and a message", denied.body, body, err, wantJSONError)
	}
}

// TestBudgetPerClientAddress: each client address has its own budget. nginx
// sees every test client as 127.0.0.1, as it sees a load balancer in
// production; realip (the commented set_real_ip_from lines, enabled for
// 127.0.0.1) takes the client from X-Forwarded-For, and nginx passes it to
// rls as X-Real-IP. A client cannot choose its own address: the X-Real-IP it
// sends is replaced, and hops it prepends to X-Forwarded-For are not trusted.
// The same holds when rls itself believes only nginx (--trusted-proxies):
// it then takes the right-most X-Forwarded-For hop, which nginx wrote.
func TestBudgetPerClientAddress(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rlsFlags []string
	}{
		{"rls trusts its peer", nil},
		{"rls trusts only nginx", []string{"--trusted-proxies", "127.0.0.1/32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			budgetPerClientAddress(t, stackOpts{limits: testLimits, rlsFlags: tc.rlsFlags})
		})
	}
}

func budgetPerClientAddress(t *testing.T, o stackOpts) {
	s := startStack(t, o)
	var steps []step
	for i := 4; i >= 0; i-- {
		steps = append(steps, step{request: request{xff: clientA}, wantStatus: 200, wantRemaining: strconv.Itoa(i), wantBackend: true})
	}
	steps = append(steps, []step{
		{request: request{xff: clientA, comment: "A spent"}, wantStatus: 429, wantRemaining: "0"},
		{request: request{xff: clientB, comment: "B has its own budget"}, wantStatus: 200, wantRemaining: "4", wantBackend: true},
		{request: request{xff: clientA, realIP: clientC, comment: "A claims to be C in X-Real-IP"}, wantStatus: 429, wantRemaining: "0"},
		{request: request{xff: forgedHop + ", " + clientA, comment: "A prepends a forged hop"}, wantStatus: 429, wantRemaining: "0"},
		{request: request{comment: "no X-Forwarded-For: the balancer itself, 127.0.0.1"}, wantStatus: 200, wantRemaining: "4", wantBackend: true},
		{request: request{xff: clientB}, wantStatus: 200, wantRemaining: "3", wantBackend: true},
	}...)
	s.run(t, steps)
}

// TestAPIKeyBudget: the x-api-key descriptor has its own budget, whatever
// address the key comes from; a request without the header has none. A
// request denied for its key consumes nothing of its address's budget.
func TestAPIKeyBudget(t *testing.T) {
	s := startStack(t, stackOpts{limits: testLimits})
	s.run(t, []step{
		// The binding limit (least remaining) is the key's: 3/h.
		{request: request{xff: "203.0.113.11", apiKey: "k1"}, wantStatus: 200, wantRemaining: "2", wantBackend: true},
		{request: request{xff: "203.0.113.12", apiKey: "k1"}, wantStatus: 200, wantRemaining: "1", wantBackend: true},
		{request: request{xff: "203.0.113.13", apiKey: "k1"}, wantStatus: 200, wantRemaining: "0", wantBackend: true},
		{request: request{xff: "203.0.113.14", apiKey: "k1", comment: "k1 spent, fresh address"}, wantStatus: 429, wantRemaining: "0"},
		{request: request{xff: "203.0.113.14", apiKey: "k2", comment: "another key"}, wantStatus: 200, wantRemaining: "2", wantBackend: true},
		// 203.0.113.14 spent one hit (the k2 request); the denied k1 request took none.
		{request: request{xff: "203.0.113.14", comment: "no key: the address only"}, wantStatus: 200, wantRemaining: "3", wantBackend: true},
	})
	// The denial names the key's limit.
	denied := s.do(t, request{xff: "203.0.113.15", apiKey: "k1"})
	if got, want := denied.header.Get("X-RateLimit-Limit"), "3, 5;w=3600, 3;w=3600"; got != want {
		t.Errorf("k1 over limit: X-RateLimit-Limit = %q, want %q", got, want)
	}
	if got, want := denied.header.Get("RateLimit"), apiKeyLabel+";r=0;t="; !strings.HasPrefix(got, want) {
		t.Errorf("k1 over limit: RateLimit = %q, want prefix %q", got, want)
	}
}

// TestOriginalMethod: auth_request's subrequest is always a GET without a
// body; X-Original-Method carries the client's method to rls, where a
// header_value_match on :method limits POSTs (2/h) apart from other methods.
// The backend still gets the real method and body.
func TestOriginalMethod(t *testing.T) {
	s := startStack(t, stackOpts{limits: testLimits})
	resps := s.run(t, []step{
		// Binding: the POST limit (2/h) before remote_address (5/h).
		{request: request{method: http.MethodPost, path: "/orders", xff: clientA, body: "first"}, wantStatus: 200, wantRemaining: "1", wantBackend: true},
		{request: request{method: http.MethodPost, path: "/orders", xff: clientA, body: "second"}, wantStatus: 200, wantRemaining: "0", wantBackend: true},
		{request: request{method: http.MethodPost, path: "/orders", xff: clientA, body: "third", comment: "POSTs spent"}, wantStatus: 429, wantRemaining: "0"},
		// remote_address: 5 - 2 POSTs - this one = 2.
		{request: request{method: http.MethodGet, path: "/orders", xff: clientA, comment: "GETs are not POSTs"}, wantStatus: 200, wantRemaining: "2", wantBackend: true},
		{request: request{method: http.MethodPut, path: "/orders", xff: clientA, body: "put"}, wantStatus: 200, wantRemaining: "1", wantBackend: true},
		{request: request{method: http.MethodPost, path: "/orders", xff: clientB, body: "b", comment: "one POST budget for all clients"}, wantStatus: 429, wantRemaining: "0"},
	})
	if got, want := resps[2].header.Get("RateLimit"), postLabel+";r=0;t="; !strings.HasPrefix(got, want) {
		t.Errorf("third POST: RateLimit = %q, want prefix %q", got, want)
	}
	hits := s.backend.all()
	want := []hit{{method: "POST", uri: "/orders", body: "first"}, {method: "POST", uri: "/orders", body: "second"}, {method: "GET", uri: "/orders"}, {method: "PUT", uri: "/orders", body: "put"}}
	if len(hits) != len(want) {
		t.Fatalf("backend hits = %d, want %d", len(hits), len(want))
	}
	for i := range want {
		if got := (hit{method: hits[i].method, uri: hits[i].uri, body: hits[i].body}); got != want[i] {
			t.Errorf("backend hit %d = %s %s %q, want %s %s %q", i+1, got.method, got.uri, got.body, want[i].method, want[i].uri, want[i].body)
		}
	}
}

// TestHost: nginx sends the client's Host to rls as X-Forwarded-Host, so
// limits on :authority apply per virtual host; an X-Forwarded-Host from the
// client is replaced.
func TestHost(t *testing.T) {
	s := startStack(t, stackOpts{limits: testLimits})
	s.run(t, []step{
		{request: request{host: "limited.example", xff: clientA}, wantStatus: 200, wantRemaining: "0", wantBackend: true},
		{request: request{host: "limited.example", xff: clientB, comment: "1/h per host, whoever asks"}, wantStatus: 429, wantRemaining: "0"},
		{request: request{host: "other.example", xff: clientB, comment: "no limit on this host"}, wantStatus: 200, wantRemaining: "4", wantBackend: true},
		{request: request{host: "other.example", fwdHost: "limited.example", xff: clientB, comment: "the client's X-Forwarded-Host is replaced"}, wantStatus: 200, wantRemaining: "3", wantBackend: true},
	})
}

// TestLocations: the subrequest location is not reachable by clients, and a
// 403 from the backend itself passes through as 403 (error_page only catches
// the 403s nginx makes, and proxy_intercept_errors is off).
func TestLocations(t *testing.T) {
	s := startStack(t, stackOpts{limits: testLimits})
	s.run(t, []step{
		{request: request{path: "/_ratelimit", xff: clientA, comment: "internal location"}, wantStatus: 404},
		{request: request{path: "/forbidden", xff: clientA, comment: "the backend's own 403"}, wantStatus: 403, wantRemaining: "4", wantBackend: true},
		{request: request{path: "/missing", xff: clientA, comment: "headers on a backend 404 too (add_header always)"}, wantStatus: 404, wantRemaining: "3", wantBackend: true},
	})
}

// TestShippedLimits: nginx.conf with config/limits.yaml, as `make run`
// serves it: domain api, the client address limited to 10/s, 120/min and
// 240/h. One request, so the per-second window cannot roll over mid-test.
func TestShippedLimits(t *testing.T) {
	s := startStack(t, stackOpts{limits: shippedLimits})
	got := s.run(t, []step{
		{request: request{path: "/api/v1/users", xff: clientA}, wantStatus: 200, wantRemaining: "9", wantBackend: true},
	})[0]
	if lim, want := got.header.Get("X-RateLimit-Limit"), "10, 10;w=1, 120;w=60, 240;w=3600"; !strings.HasPrefix(lim, want) {
		t.Errorf("GET /api/v1/users: X-RateLimit-Limit = %q, want prefix %q", lim, want)
	}
}

// TestStandInBackend: nginx.conf as the try-it block runs it, with its own
// stand-in backend (the last server block) and config/limits.yaml: the
// request is limited and answered by the stand-in, which names it. One
// request, so the per-second window cannot roll over mid-test.
func TestStandInBackend(t *testing.T) {
	rls := startRLS(t, shippedLimits, "")
	_, base := startNginx(t, findNginx(t), rls.addr, "", false)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/api/v1/users?page=2")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := "backend: GET /api/v1/users?page=2\n"; resp.StatusCode != 200 || string(body) != want {
		t.Errorf("GET /api/v1/users?page=2 = %d %q, want 200 %q (the stand-in's answer)", resp.StatusCode, body, want)
	}
	if got := resp.Header.Get("X-RateLimit-Remaining"); got != "9" {
		t.Errorf("GET /api/v1/users?page=2: X-RateLimit-Remaining = %q, want 9 (10/s per address)", got)
	}
}

// TestRLSDown: what clients get while rls is stopped or stuck, with the file
// as shipped (fail closed: 500, the backend protected) and with its
// fail-open line enabled (the backend answers, without rate-limit headers);
// and that limiting resumes when rls is back.
func TestRLSDown(t *testing.T) {
	for _, tc := range []struct {
		name        string
		failOpen    bool
		wantDown    int
		wantBackend bool
	}{
		{"shipped: fail closed", false, http.StatusInternalServerError, false},
		{"fail-open line enabled", true, http.StatusOK, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startStack(t, stackOpts{limits: testLimits, failOpen: tc.failOpen})
			s.run(t, []step{{request: request{xff: clientA, comment: "rls up"}, wantStatus: 200, wantRemaining: "4", wantBackend: true}})

			// Stuck: rls accepts connections (the kernel does) but never
			// answers; proxy_read_timeout turns that into a failure.
			if err := s.rls.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			s.run(t, []step{{request: request{xff: clientA, comment: "rls stuck"}, wantStatus: tc.wantDown, wantBackend: tc.wantBackend}})
			t.Logf("answer while rls was stuck took %v", time.Since(start).Round(time.Millisecond))
			if err := s.rls.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}

			// Stopped: SIGTERM drains and exits 0; connections are refused.
			if err := s.rls.Stop(); err != nil {
				t.Errorf("rls: %v", err)
			}
			down := s.run(t, []step{
				{request: request{xff: clientA, comment: "rls stopped"}, wantStatus: tc.wantDown, wantBackend: tc.wantBackend},
				{request: request{method: http.MethodPost, xff: clientB, body: "b", comment: "rls stopped"}, wantStatus: tc.wantDown, wantBackend: tc.wantBackend},
			})
			for _, name := range []string{"X-RateLimit-Limit", "RateLimit", "Retry-After"} {
				if v := down[0].header.Get(name); v != "" {
					t.Errorf("rls stopped: %s = %q, want no such header", name, v)
				}
			}
			if fromBackend := strings.HasPrefix(down[1].body, "backend: POST /"); fromBackend != tc.wantBackend {
				t.Errorf("rls stopped: POST / body = %q, from the backend = %v, want %v", down[1].body, fromBackend, tc.wantBackend)
			}

			// Back on the same address (a new process: fresh counters in the
			// memory store). nginx needs no reload.
			s.rls = startRLS(t, testLimits, s.rls.addr)
			s.run(t, []step{{request: request{xff: clientA, comment: "rls back"}, wantStatus: 200, wantRemaining: "4", wantBackend: true}})
		})
	}
}

// TestConfEditsApplyOnce: the rows of confEdits find what they replace in
// nginx.conf exactly once, so the other tests run the example as written.
func TestConfEditsApplyOnce(t *testing.T) {
	src, err := os.ReadFile(exampleConf)
	if err != nil {
		t.Fatal(err)
	}
	for _, failOpen := range []bool{false, true} {
		if _, err := render(src, confEdits("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4", failOpen)); err != nil {
			t.Errorf("render(failOpen=%v): %v", failOpen, err)
		}
	}
}

// edit replaces old with new in nginx.conf; old must occur exactly once.
type edit struct{ old, new string }

// confEdits are the only differences between the shipped nginx.conf and
// what the tests run: where things listen (free ports instead of 8888, 8080
// and 9000, so that tests run side by side), realip trusting the test's
// 127.0.0.1 "load balancer", and optionally the fail-open line. Files go
// where the shipped file puts them: under the prefix.
func confEdits(listen, standIn, rlsAddr, backendAddr string, failOpen bool) []edit {
	edits := []edit{
		{"listen 8888;", "listen " + listen + ";"},
		{"listen 127.0.0.1:9000;", "listen " + standIn + ";"},
		{"server 127.0.0.1:8080;", "server " + rlsAddr + ";"},
		{"server 127.0.0.1:9000;", "server " + backendAddr + ";"},
		{"# set_real_ip_from 10.0.0.0/8;", "set_real_ip_from 127.0.0.1;"},
		{"# real_ip_header X-Forwarded-For;", "real_ip_header X-Forwarded-For;"},
		{"# real_ip_recursive on;", "real_ip_recursive on;"},
	}
	if failOpen {
		edits = append(edits, edit{"# error_page 500 = @failopen;", "error_page 500 = @failopen;"})
	}
	return edits
}

func render(src []byte, edits []edit) ([]byte, error) {
	out := string(src)
	for _, e := range edits {
		if n := strings.Count(out, e.old); n != 1 {
			return nil, fmt.Errorf("nginx.conf: %q occurs %d times, want exactly 1", e.old, n)
		}
		out = strings.Replace(out, e.old, e.new, 1)
	}
	return []byte(out), nil
}

// startNginx runs the edited nginx.conf in the foreground with its own
// prefix directory, on free ports (tried again with others when one was
// taken meanwhile). backendAddr "" sends the requests to the file's own
// stand-in backend. The test's end stops it with SIGQUIT (graceful).
func startNginx(t *testing.T, bin, rlsAddr, backendAddr string, failOpen bool) (*proctest.Proc, string) {
	t.Helper()
	src, err := os.ReadFile(exampleConf)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "rls-nginx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Workers run as nobody when nginx starts as root; let them reach the
	// temp directories the master creates for them.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nginx.conf")
	o := proctest.Options{Name: "nginx", StopSignal: syscall.SIGQUIT, ExtraLogs: []string{filepath.Join(dir, "access.log")}}
	p, listen := proctest.StartListening(t, o, func(listen string) []string {
		standIn := proctest.Addr(t)
		upstream := backendAddr
		if upstream == "" {
			upstream = standIn
		}
		out, err := render(src, confEdits(listen, standIn, rlsAddr, upstream, failOpen))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(conf, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return []string{bin, "-p", dir + "/", "-c", conf, "-e", "stderr",
			"-g", "daemon off; master_process on; pid " + filepath.Join(dir, "nginx.pid") + "; error_log stderr notice;"}
	}, proctest.Listening)
	return p, "http://" + listen
}

// rlsProc is a running `rls serve`.
type rlsProc struct {
	*proctest.Proc
	addr string // its HTTP address
}

// startRLS runs rls serve with the limits on addr ("": a free port, tried
// again with another when it was taken meanwhile) and waits until /readyz
// answers 200. The test's end stops it and wants exit status 0.
func startRLS(t *testing.T, limits, addr string, flags ...string) *rlsProc {
	t.Helper()
	args := func(addr string) []string {
		return append([]string{"serve", "--config", limits, "--grpc-addr", "127.0.0.1:0", "--http-addr", addr, "--shutdown-timeout", "5s"}, flags...)
	}
	if addr != "" {
		return &rlsProc{proctest.StartRLS(t, addr, args(addr)...), addr}
	}
	bin := proctest.RLSBinary(t)
	p, addr := proctest.StartListening(t, proctest.Options{Name: "rls"},
		func(addr string) []string { return append([]string{bin}, args(addr)...) },
		func(addr string) func() bool { return proctest.HTTPOK("http://" + addr + "/readyz") })
	return &rlsProc{p, addr}
}

// hit is one request the backend received.
type hit struct {
	method, uri, body, realIP string
}

// backend is the protected application: it answers "backend: METHOD URI",
// 403 on /forbidden and 404 on /missing, and records every request.
type backend struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits []hit
}

func startBackend(t *testing.T) *backend {
	b := &backend{}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.hits = append(b.hits, hit{method: r.Method, uri: r.RequestURI, body: string(body), realIP: r.Header.Get("X-Real-IP")})
		b.mu.Unlock()
		switch r.URL.Path {
		case "/forbidden":
			w.WriteHeader(http.StatusForbidden)
		case "/missing":
			w.WriteHeader(http.StatusNotFound)
		}
		fmt.Fprintf(w, "backend: %s %s\n", r.Method, r.RequestURI)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

func (b *backend) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.hits)
}

func (b *backend) last() hit {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.hits) == 0 {
		return hit{}
	}
	return b.hits[len(b.hits)-1]
}

func (b *backend) all() []hit {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]hit(nil), b.hits...)
}
