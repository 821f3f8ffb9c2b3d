package service

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
)

const testConfig = `
domain: api
http_descriptors:
  - actions: [{remote_address: {}}]
  - actions:
      - request_headers: {header_name: x-api-key, descriptor_key: api_key}
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 3}
      - {unit: minute, requests_per_unit: 5}
  - key: api_key
    value: vip
    rate_limit: {unlimited: true}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 2, name: per_key}
  - key: plan
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 100, name: gold, replaces: [{name: per_key}]}
  - key: tenant
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: second, requests_per_unit: 1, shadow_mode: true, name: try_strict}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: override_me
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: whitelisted
---
domain: other
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
`

type fixture struct {
	svc   *Service
	clock *storetest.Clock
	seen  *tally // what the service tells its observers
}

func newFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(testConfig))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	f := &fixture{clock: storetest.NewClock(storetest.T0), seen: newTally()}
	if opts.Store == nil {
		ms := memstore.New(memstore.Options{Now: f.clock.Now})
		t.Cleanup(func() { ms.Close() })
		opts.Store = ms
	}
	opts.Observers = append(opts.Observers, f.seen)
	f.svc = New(opts)
	if err := f.svc.Reload(func() (*config.Config, error) { return cfg, nil }); err != nil {
		t.Fatal(err)
	}
	return f
}

func desc(kv ...string) Descriptor {
	var d Descriptor
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (f *fixture) check(t *testing.T, req *Request) *Response {
	t.Helper()
	resp, err := f.svc.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s): %v", req.Domain, err)
	}
	if resp.Code != OK && resp.Code != OverLimit {
		t.Fatalf("overall code %d is neither OK nor OVER_LIMIT", resp.Code)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	return resp
}

func TestMultiWindow(t *testing.T) {
	f := newFixture(t, Options{})
	ip := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1")}}
	steps := []struct {
		at        time.Duration
		code      Code
		window    time.Duration // of the binding limit
		remaining uint32
		reset     time.Duration
	}{
		{0, OK, time.Second, 2, time.Second},
		{0, OK, time.Second, 1, time.Second},
		{0, OK, time.Second, 0, time.Second},
		{0, OverLimit, time.Second, 0, time.Second},
		{time.Second, OK, time.Minute, 1, 59 * time.Second}, // 4 of 5 per minute used
		{time.Second, OK, time.Minute, 0, 59 * time.Second},
		{2 * time.Second, OverLimit, time.Minute, 0, 58 * time.Second}, // the second has room, the minute not
	}
	for i, s := range steps {
		f.clock.Set(storetest.T0.Add(s.at))
		resp := f.check(t, ip)
		st := resp.Statuses[0]
		if resp.Code != s.code || st.Code != s.code || st.Limit == nil || st.Limit.Rule.Window != s.window || st.Remaining != s.remaining || st.ResetAfter != s.reset {
			var w time.Duration
			if st.Limit != nil {
				w = st.Limit.Rule.Window
			}
			t.Fatalf("step %d (T0+%s): %s, status %s limit %s remaining %d reset %s; want %s, %s limit %s remaining %d reset %s",
				i, s.at, resp.Code, st.Code, w, st.Remaining, st.ResetAfter, s.code, s.code, s.window, s.remaining, s.reset)
		}
	}
}

func TestStatusesInOrderAndAllOrNothing(t *testing.T) {
	f := newFixture(t, Options{})
	req := &Request{Domain: "api", Descriptors: []Descriptor{
		desc("whitelisted", "x"),
		desc("api_key", "k1"),
		desc("nothing", "here"),
		desc("api_key", "vip"),
	}}
	for i := range 2 {
		resp := f.check(t, req)
		if resp.Code != OK || resp.Statuses[1].Remaining != uint32(1-i) {
			t.Fatalf("request %d: %s, api_key remaining %d, want OK %d", i, resp.Code, resp.Statuses[1].Remaining, 1-i)
		}
		for _, j := range []int{0, 2} {
			if st := resp.Statuses[j]; st.Code != OK || st.Limit != nil || st.Remaining != 0 {
				t.Errorf("request %d: status %d = %+v, want OK with no limit", i, j, st)
			}
		}
		if st := resp.Statuses[3]; st.Code != OK || st.Limit != nil || st.Remaining != math.MaxUint32 {
			t.Errorf("request %d: unlimited status = %+v, want OK, no limit, remaining 4294967295", i, st)
		}
	}
	resp := f.check(t, req)
	if resp.Code != OverLimit || resp.Statuses[1].Code != OverLimit || resp.Statuses[0].Code != OK {
		t.Fatalf("third request: %s (%s, %s), want OVER_LIMIT (OK, OVER_LIMIT)", resp.Code, resp.Statuses[0].Code, resp.Statuses[1].Code)
	}
	// A request that another descriptor denies consumes nothing.
	both := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.9.9.9"), desc("api_key", "k1")}}
	f.check(t, both)
	resp = f.check(t, &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.9.9.9")}})
	if resp.Statuses[0].Remaining != 2 {
		t.Errorf("remote_address remaining = %d after a request denied by api_key, want 2 (nothing consumed)", resp.Statuses[0].Remaining)
	}
}

func TestUnknownDomainIsOK(t *testing.T) {
	f := newFixture(t, Options{})
	resp := f.check(t, &Request{Domain: "nope", Descriptors: []Descriptor{
		{Entries: []config.Entry{{Key: "k", Value: "v"}}, Override: &Override{RequestsPerUnit: 0, Unit: engine.Second}},
	}})
	if resp.Code != OK || resp.Statuses[0].Code != OK || resp.Statuses[0].Limit != nil {
		t.Errorf("unknown domain: %+v, want OK with no limit, as envoyproxy/ratelimit answers", resp)
	}
}

func TestOverride(t *testing.T) {
	f := newFixture(t, Options{})
	d := desc("override_me", "x")
	d.Override = &Override{RequestsPerUnit: 2, Unit: engine.Minute}
	req := &Request{Domain: "api", Descriptors: []Descriptor{d}}
	for i, want := range []Code{OK, OK, OverLimit} {
		resp := f.check(t, req)
		if resp.Code != want || resp.Statuses[0].Limit.Rule.Limit != 2 || resp.Statuses[0].Limit.Rule.Unit != engine.Minute {
			t.Fatalf("request %d with override 2/min: %s limit %+v, want %s with the override", i, resp.Code, resp.Statuses[0].Limit, want)
		}
	}
	// The override counts on the counter of the configured unnamed minute
	// limit of the same entries (as envoyproxy/ratelimit does).
	resp := f.check(t, &Request{Domain: "api", Descriptors: []Descriptor{desc("override_me", "x")}})
	if resp.Statuses[0].Remaining != 997 {
		t.Errorf("configured limit remaining = %d after 2 override hits and this one, want 997 (the denied override hit costs nothing)", resp.Statuses[0].Remaining)
	}
}

func TestReplaces(t *testing.T) {
	f := newFixture(t, Options{})
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "k"), desc("plan", "gold")}}
	for i := range 5 {
		resp := f.check(t, req)
		if resp.Code != OK || resp.Statuses[0].Limit != nil || resp.Statuses[1].Limit.Name != "gold" {
			t.Fatalf("request %d: %s, api_key limit %v, plan limit %v; want OK, per_key replaced by gold", i, resp.Code, resp.Statuses[0].Limit, resp.Statuses[1].Limit)
		}
	}
	// per_key was not counted while replaced.
	resp := f.check(t, &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "k")}})
	if resp.Statuses[0].Remaining != 1 {
		t.Errorf("per_key remaining = %d, want 1: a replaced limit must not be counted", resp.Statuses[0].Remaining)
	}
}

func TestShadow(t *testing.T) {
	f := newFixture(t, Options{})
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("tenant", "t1"), desc("user", "u1")}}
	for i := range 4 {
		resp := f.check(t, req)
		if resp.Code != OK || resp.Statuses[0].Code != OK || resp.Statuses[1].Code != OK {
			t.Fatalf("request %d: %s (%s, %s), want all OK: shadow limits never deny", i, resp.Code, resp.Statuses[0].Code, resp.Statuses[1].Code)
		}
		if got := resp.Statuses[1].Limit; got == nil || got.Shadow {
			t.Errorf("request %d: user's binding limit %+v, want the enforced minute limit, not the shadow one", i, got)
		}
	}
	for _, label := range []string{"try_strict", "tenant/1m"} {
		if got := f.seen.verdicts[label]["shadow_over_limit"]; got != 3 {
			t.Errorf("shadow denials of %s told to the observers: %v, want 3", label, got)
		}
	}
}

func TestQuotaMode(t *testing.T) {
	f := newFixture(t, Options{})
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("quota", "a"), desc("quota", "b")}}
	if resp := f.check(t, req); resp.Code != OK {
		t.Fatalf("first request: %s, want OK", resp.Code)
	}
	resp := f.check(t, req)
	if resp.Code != OverLimit {
		t.Fatalf("second request with both quotas over: %s, want OVER_LIMIT", resp.Code)
	}
	resp = f.check(t, &Request{Domain: "api", Descriptors: []Descriptor{desc("quota", "a"), desc("quota", "c")}})
	if resp.Code != OK || resp.Statuses[0].Code != OverLimit || resp.Statuses[1].Code != OK {
		t.Errorf("quota a over, c free: %s (%s, %s), want OK (OVER_LIMIT, OK)", resp.Code, resp.Statuses[0].Code, resp.Statuses[1].Code)
	}
}

func TestHits(t *testing.T) {
	f := newFixture(t, Options{})
	ip := func(hits *uint64, refund bool, addend uint32) *Request {
		d := desc("remote_address", "10.1.1.1")
		if hits != nil {
			d.HasHits, d.Hits = true, *hits
		}
		d.Refund = refund
		return &Request{Domain: "api", Descriptors: []Descriptor{d}, HitsAddend: addend}
	}
	zero, two := uint64(0), uint64(2)
	steps := []struct {
		req       *Request
		code      Code
		remaining uint32
	}{
		{ip(nil, false, 0), OK, 2},   // hits_addend 0 means 1
		{ip(&zero, false, 5), OK, 2}, // descriptor hits 0: only look, overrides the request's 5
		{ip(nil, false, 2), OK, 0},
		{ip(&two, true, 0), OK, 2}, // refund
		{ip(&two, false, 0), OK, 0},
		{ip(nil, false, 1), OverLimit, 0},
	}
	for i, s := range steps {
		resp := f.check(t, s.req)
		if resp.Code != s.code || resp.Statuses[0].Remaining != s.remaining {
			t.Fatalf("step %d: %s remaining %d, want %s %d", i, resp.Code, resp.Statuses[0].Remaining, s.code, s.remaining)
		}
	}
}

func TestInvalidRequests(t *testing.T) {
	f := newFixture(t, Options{})
	many := make([]Descriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("k", "v")
	}
	deep := Descriptor{}
	for range MaxEntries + 1 {
		deep.Entries = append(deep.Entries, config.Entry{Key: "k", Value: "v"})
	}
	hugeHits := desc("k", "v")
	hugeHits.HasHits, hugeHits.Hits = true, 1<<63
	noUnit := desc("k", "v")
	noUnit.Override = &Override{RequestsPerUnit: 5}
	longOverride := desc("k", "v")
	longOverride.Override = &Override{RequestsPerUnit: 5, Unit: engine.Year, UnitMultiplier: 101}
	bigValues := make([]Descriptor, 20)
	for i := range bigValues {
		bigValues[i] = desc("k", strings.Repeat("v", MaxValueLen))
	}
	for _, tc := range []struct {
		req   *Request
		field string
	}{
		{&Request{Descriptors: []Descriptor{desc("k", "v")}}, "domain"},
		{&Request{Domain: "api"}, "descriptors"},
		{&Request{Domain: "api", Descriptors: []Descriptor{{}}}, "descriptors[0].entries"},
		{&Request{Domain: "api", Descriptors: []Descriptor{desc("k", "v"), desc("", "v")}}, "descriptors[1].entries[0].key"},
		{&Request{Domain: "api", Descriptors: many}, "descriptors"},
		{&Request{Domain: "api", Descriptors: []Descriptor{deep}}, "descriptors[0].entries"},
		{&Request{Domain: "api", Descriptors: []Descriptor{desc("k", strings.Repeat("v", MaxValueLen+1))}}, "descriptors[0].entries[0].value"},
		{&Request{Domain: "api", Descriptors: []Descriptor{desc(strings.Repeat("k", MaxKeyLen+1), "v")}}, "descriptors[0].entries[0].key"},
		{&Request{Domain: "api", Descriptors: []Descriptor{hugeHits}}, "descriptors[0].hits_addend"},
		{&Request{Domain: "api", Descriptors: []Descriptor{noUnit}}, "descriptors[0].limit.unit"},
		{&Request{Domain: "api", Descriptors: []Descriptor{longOverride}}, "descriptors[0].limit.unit_multiplier"},
		{&Request{Domain: "api", Descriptors: bigValues}, "descriptors"},
		{&Request{Domain: strings.Repeat("d", MaxDomainLen+1), Descriptors: []Descriptor{desc("k", "v")}}, "domain"},
	} {
		_, err := f.svc.ShouldRateLimit(context.Background(), tc.req)
		var inv *InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("ShouldRateLimit(invalid %s) error = %v, want an InvalidError naming %s", tc.field, err, tc.field)
		}
	}
}

// failingStore fails every call.
type failingStore struct{ err error }

func (s failingStore) Apply(context.Context, []engine.Item, []engine.Result) (bool, error) {
	return false, s.err
}

func (s failingStore) Peek(context.Context, []engine.Item, []engine.Result) (bool, error) {
	return false, s.err
}

func (s failingStore) Reset(context.Context, []engine.Item) (int, error) { return 0, s.err }
func (s failingStore) Ping(context.Context) error                        { return s.err }

func TestStoreErrorPolicy(t *testing.T) {
	storeErr := errors.New("connection refused")
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("whitelisted", "x"), desc("remote_address", "10.0.0.1")}}

	f := newFixture(t, Options{Store: failingStore{storeErr}, OnStoreError: FailError})
	if _, err := f.svc.ShouldRateLimit(context.Background(), req); !errors.Is(err, ErrStoreUnavailable) || !errors.Is(err, storeErr) {
		t.Errorf("policy error: err = %v, want ErrStoreUnavailable wrapping the store's error", err)
	}

	f = newFixture(t, Options{Store: failingStore{storeErr}, OnStoreError: FailAllow})
	if resp := f.check(t, req); resp.Code != OK || resp.Statuses[1].Code != OK {
		t.Errorf("policy allow: %s (%s), want OK", resp.Code, resp.Statuses[1].Code)
	}

	f = newFixture(t, Options{Store: failingStore{storeErr}, OnStoreError: FailDeny})
	resp := f.check(t, req)
	if resp.Code != OverLimit || resp.Statuses[0].Code != OK || resp.Statuses[1].Code != OverLimit {
		t.Errorf("policy deny: %s (%s, %s), want OVER_LIMIT (OK for the unlimited-free descriptor, OVER_LIMIT)", resp.Code, resp.Statuses[0].Code, resp.Statuses[1].Code)
	}
	if f.seen.storeErrors != 1 || f.seen.codes["OVER_LIMIT"] != 1 || len(f.seen.verdicts) != 0 {
		t.Errorf("observers told of %d store errors, answers %v, verdicts %v; want 1 error, 1 OVER_LIMIT, no verdict", f.seen.storeErrors, f.seen.codes, f.seen.verdicts)
	}

	// The headers follow the caller's mode: /auth and ext_authz always
	// want them (Retry-After included), gRPC per --response-headers.
	for _, mode := range []HeaderMode{HeadersOff, HeadersBoth} {
		resp, err := f.svc.decide(context.Background(), req, mode)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, h := range resp.Headers {
			got[h.Key] = h.Value
		}
		if mode == HeadersOff && len(got) != 0 {
			t.Errorf("policy deny, headers off: %v, want none", got)
		}
		if mode == HeadersBoth && (got[headerRetryAfter] != "1" || got[headerXRemaining] != "0" || got[headerRateLimit] == "") {
			t.Errorf("policy deny, headers both: %v, want Retry-After 1 (the first window), remaining 0 and RateLimit", got)
		}
		if want := `"remote_address/1s";q=3;w=1, "remote_address/1m";q=5;w=60`; mode == HeadersBoth && got[headerPolicy] != want {
			t.Errorf("policy deny: RateLimit-Policy %q, want every limit: %q", got[headerPolicy], want)
		}
	}
}

func TestHeaders(t *testing.T) {
	f := newFixture(t, Options{Headers: HeadersBoth})
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1"), desc("api_key", "k")}}
	resp := f.check(t, req)
	got := map[string]string{}
	for _, h := range resp.Headers {
		got[h.Key] = h.Value
	}
	want := map[string]string{
		headerXLimit:     `3, 3;w=1, 5;w=60, 2;w=3600;name="per_key"`,
		headerXRemaining: "1",
		headerXReset:     "3600",
		headerPolicy:     `"remote_address/1s";q=3;w=1, "remote_address/1m";q=5;w=60, "per_key";q=2;w=3600`,
		headerRateLimit:  `"per_key";r=1;t=3600`,
	}
	// Least remaining: per_key (1 left) and the second (2 left): per_key.
	want[headerXLimit] = `2, 3;w=1, 5;w=60, 2;w=3600;name="per_key"`
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got[headerRetryAfter]; ok {
		t.Errorf("Retry-After on an OK response")
	}
	f.check(t, req)
	resp = f.check(t, req)
	if resp.Code != OverLimit {
		t.Fatalf("third request: %s, want OVER_LIMIT", resp.Code)
	}
	got = map[string]string{}
	for _, h := range resp.Headers {
		got[h.Key] = h.Value
	}
	if got[headerRetryAfter] != "3600" || got[headerXRemaining] != "0" || got[headerRateLimit] != `"per_key";r=0;t=3600` {
		t.Errorf("limited headers = %v, want Retry-After 3600, remaining 0 of per_key", got)
	}

	off := newFixture(t, Options{})
	if resp := off.check(t, req); len(resp.Headers) != 0 {
		t.Errorf("headers with mode off: %v", resp.Headers)
	}
}

func TestReloadKeepsOldConfigOnError(t *testing.T) {
	f := newFixture(t, Options{})
	old := f.svc.Config()
	err := f.svc.Reload(func() (*config.Config, error) { return nil, errors.New("bad.yaml:3:1: oops") })
	if err == nil || f.svc.Config() != old {
		t.Fatalf("Reload(failing) = %v, config swapped = %v; want an error and the old config kept", err, f.svc.Config() != old)
	}
	if n := len(f.seen.reloads); n != 2 || f.seen.reloads[1] == nil {
		t.Errorf("observers told of reloads %v after a failed one, want the first's nil and the failure", f.seen.reloads)
	}
	cfg, _ := config.Parse("new.yaml", []byte("domain: fresh\n"))
	if err := f.svc.Reload(func() (*config.Config, error) { return cfg, nil }); err != nil || f.svc.Config() != cfg {
		t.Fatalf("Reload(good) = %v, want the new config in use", err)
	}
	if n := len(f.seen.reloads); n != 3 || f.seen.reloads[2] != nil || f.seen.configs != 2 {
		t.Errorf("observers told of reloads %v and %d configs after a good reload, want a third reload, nil, and 2 configs", f.seen.reloads, f.seen.configs)
	}
}

func TestReady(t *testing.T) {
	svc := New(Options{Store: failingStore{}})
	if err := svc.Ready(context.Background()); !errors.Is(err, errNoConfig) {
		t.Errorf("Ready before a config = %v, want errNoConfig", err)
	}
	f := newFixture(t, Options{})
	if err := f.svc.Ready(context.Background()); err != nil {
		t.Errorf("Ready = %v, want nil", err)
	}
}

type httpReq struct {
	headers map[string]string
	addr    string
}

func (r httpReq) Header(name string) (string, bool) { v, ok := r.headers[name]; return v, ok }
func (r httpReq) ClientAddr() netip.Addr {
	a, _ := netip.ParseAddr(r.addr)
	return a
}

func TestCheckHTTP(t *testing.T) {
	f := newFixture(t, Options{})
	r := httpReq{headers: map[string]string{"x-api-key": "k9"}, addr: "192.0.2.1"}
	for i, want := range []Code{OK, OK, OverLimit} {
		resp, err := f.svc.CheckHTTP(context.Background(), "api", r)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != want || len(resp.Statuses) != 2 {
			t.Fatalf("request %d: %s with %d statuses, want %s with 2 (remote_address, api_key)", i, resp.Code, len(resp.Statuses), want)
		}
		if len(resp.Headers) == 0 {
			t.Errorf("request %d: no rate-limit headers; /auth always sends them", i)
		}
	}
	if _, err := f.svc.CheckHTTP(context.Background(), "nope", r); !errors.Is(err, ErrUnknownDomain) {
		t.Errorf("CheckHTTP(unknown domain) = %v, want ErrUnknownDomain", err)
	}
	resp, err := f.svc.CheckHTTP(context.Background(), "other", r)
	if err != nil || resp.Code != OK {
		t.Errorf("CheckHTTP(domain without http_descriptors) = %v, %v; want OK", resp, err)
	}
}

func BenchmarkShouldRateLimit(b *testing.B) {
	benchDecisions(b, Options{}, 1e9)
}

func TestAnswerMargin(t *testing.T) {
	for _, tc := range []struct{ left, want time.Duration }{
		{20 * time.Millisecond, 2 * time.Millisecond}, // Envoy's default timeout
		{100 * time.Millisecond, 5 * time.Millisecond},
		{time.Second, 5 * time.Millisecond},
		{3 * time.Millisecond, time.Millisecond},
		{0, time.Millisecond},
	} {
		if got := answerMargin(tc.left); got != tc.want {
			t.Errorf("answerMargin(%s) = %s, want %s", tc.left, got, tc.want)
		}
	}
}

// --shadow (ShadowAll): every limit judged and counted, nothing denied;
// what would have been denied is told to the observers as a shadow
// denial.
func TestShadowAll(t *testing.T) {
	f := newFixture(t, Options{ShadowAll: true})
	ip := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1")}}
	for i := range 5 {
		resp := f.check(t, ip)
		if resp.Code != OK {
			t.Fatalf("request %d under --shadow: %v, want OK", i, resp.Code)
		}
	}
	// 3 a second: the 4th and 5th would have been denied.
	if got := f.seen.verdicts["remote_address/1s"]["shadow_over_limit"]; got != 2 {
		t.Errorf("shadow denials of remote_address/1s told to the observers: %v, want 2", got)
	}
	ex, err := f.svc.Explain(context.Background(), ip)
	if err != nil {
		t.Fatal(err)
	}
	if got := ex.Descriptors[0].Limits[0].Applies; got != Shadow {
		t.Errorf("explain under --shadow: applies %s, want shadow", got)
	}
}
