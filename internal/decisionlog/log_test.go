package decisionlog

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

const testConfig = `
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: minute, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 100, shadow_mode: true, name: hourly}
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plan
    value: gold
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
`

var t0 = time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)

type clock struct{ us atomic.Int64 }

func (c *clock) set(t time.Time) { c.us.Store(t.UnixMicro()) }
func (c *clock) now() time.Time  { return time.UnixMicro(c.us.Load()).UTC() }

func mustParse(t testing.TB, src string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("limits.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func desc(kv ...string) service.Descriptor {
	var d service.Descriptor
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// logged returns a service on a memory store at clk that logs to a file
// of a temporary directory with opts, and the log and its path.
func logged(t testing.TB, clk *clock, cfg *config.Config, opts Options) (*service.Service, *Log, string) {
	t.Helper()
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "decisions.log")
	}
	opts.Now = clk.now
	l, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	l.Start()
	t.Cleanup(func() { l.Close() })
	store := memstore.New(memstore.Options{Now: clk.now, SweepEvery: time.Hour})
	t.Cleanup(func() { store.Close() })
	svc := service.New(service.Options{Store: store, Now: clk.now, Observers: []service.Observer{l}})
	svc.SetConfig(cfg)
	return svc, l, opts.Path
}

func readAll(t testing.TB, paths ...string) []*Record {
	t.Helper()
	var out []*Record
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		err = Read(f, p, func(r *Record) error { out = append(out, r); return nil })
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestRecords: each decision and reset is one record, read back as it
// was made: instant, domain, config version, code, descriptors with their
// hits, refunds and overrides, and each limit's own verdict; a value that
// is not UTF-8 comes back as it was. A header comes first.
func TestRecords(t *testing.T) {
	var clk clock
	clk.set(t0)
	cfg := mustParse(t, testConfig)
	svc, l, path := logged(t, &clk, cfg, Options{Switches: Switches{CountDeniedHits: true}})
	ctx := context.Background()
	ip := desc("remote_address", "203.0.113.7")
	steps := []struct {
		req  *service.Request
		code string
	}{
		{&service.Request{Domain: "api", Descriptors: []service.Descriptor{ip}, HitsAddend: 2}, "OK"},
		{&service.Request{Domain: "api", Descriptors: []service.Descriptor{ip, desc("path", "/api/x")}}, "OVER_LIMIT"},
		{&service.Request{Domain: "api", Descriptors: []service.Descriptor{{Entries: ip.Entries, HasHits: true, Hits: 1, Refund: true}}}, "OK"},
		{&service.Request{Domain: "api", Descriptors: []service.Descriptor{{Entries: []config.Entry{{Key: "k", Value: "\xff\xfe"}},
			Override: &service.Override{RequestsPerUnit: 3, Unit: engine.Second}}}}, "OK"},
		{&service.Request{Domain: "nope", Descriptors: []service.Descriptor{ip}}, "OK"},
	}
	for i, s := range steps {
		clk.set(t0.Add(time.Duration(i) * time.Millisecond))
		resp, err := svc.ShouldRateLimit(ctx, s.req)
		if err != nil || resp.Code.String() != s.code {
			t.Fatalf("step %d: %v, %v; want %s", i+1, resp, err, s.code)
		}
	}
	if _, err := svc.Reset(ctx, &service.Request{Domain: "api", Descriptors: []service.Descriptor{ip}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, path)
	if len(recs) != 7 {
		t.Fatalf("%d records, want a header, 5 decisions and a reset", len(recs))
	}
	h := recs[0]
	version := ConfigVersion(cfg)
	if h.Kind != Header || h.Config != version || h.Sample != 1 || h.Hashed || !h.Switches.CountDeniedHits || len(h.Files) != 1 || h.Files[0] != "limits.yaml" {
		t.Errorf("header %+v, want config %s of limits.yaml, sample 1, count_denied_hits", h, version)
	}
	d := recs[2]
	if d.Kind != Decision || !d.Time.Equal(t0.Add(time.Millisecond)) || d.Domain != "api" || d.Config != version || d.Code != "OVER_LIMIT" {
		t.Errorf("record 2: %+v", d)
	}
	if len(d.Descriptors) != 2 || d.Descriptors[0].Hits != 1 || d.Descriptors[1].Entries[0] != (config.Entry{Key: "path", Value: "/api/x"}) {
		t.Errorf("record 2's descriptors: %+v", d.Descriptors)
	}
	wantLimits := []Verdict{{0, "remote_address/1m", false, false}, {0, "hourly", true, true}, {1, "path=/api/*/1m", true, false}}
	if fmt.Sprint(d.Limits) != fmt.Sprint(wantLimits) {
		t.Errorf("record 2's limits: %+v, want %+v", d.Limits, wantLimits)
	}
	if recs[1].Descriptors[0].Hits != 2 {
		t.Errorf("record 1: hits %d, want the request's hits_addend 2", recs[1].Descriptors[0].Hits)
	}
	if r := recs[3].Descriptors[0]; !r.Refund {
		t.Errorf("record 3: %+v, want a refund", r)
	}
	if r := recs[4].Descriptors[0]; r.Entries[0].Value != "\xff\xfe" || r.Override == nil || r.Override.RequestsPerUnit != 3 || r.Override.Unit != "second" {
		t.Errorf("record 4: %+v, want the value \\xff\\xfe and an override of 3 a second", r)
	}
	if r := recs[5]; r.Domain != "nope" || len(r.Limits) != 0 {
		t.Errorf("record 5: %+v, want domain nope and no limit", r)
	}
	if r := recs[6]; r.Kind != Reset || r.Descriptors[0].Entries[0].Value != "203.0.113.7" {
		t.Errorf("record 6: %+v, want the reset of remote_address=203.0.113.7", r)
	}
	if st := l.Stats(); st.Written != 6 || st.Dropped != 0 {
		t.Errorf("stats %+v, want 6 written, none dropped", st)
	}
}

// TestSampleByKey: at a share of 10 %, about a tenth of the keys are
// kept, each with every one of its decisions, and a kept request's other
// descriptors are marked sampled.
func TestSampleByKey(t *testing.T) {
	var clk clock
	clk.set(t0)
	svc, l, path := logged(t, &clk, mustParse(t, testConfig), Options{Sample: 0.1})
	ctx := context.Background()
	const keys, per = 2000, 3
	for i := range keys * per {
		ip := desc("remote_address", fmt.Sprintf("10.0.%d.%d", (i%keys)/256, (i%keys)%256))
		if _, err := svc.ShouldRateLimit(ctx, &service.Request{Domain: "api", Descriptors: []service.Descriptor{ip, desc("path", "/api/common")}}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	counts := map[string]int{}
	for _, r := range readAll(t, path)[1:] {
		ipKept, pathKept := !r.Descriptors[0].Sampled, !r.Descriptors[1].Sampled
		if !ipKept && !pathKept {
			t.Fatalf("a record with no key kept: %+v", r)
		}
		if ipKept {
			counts[r.Descriptors[0].Entries[0].Value]++
		}
	}
	// The one path key is kept or not; each address's decisions all or none.
	for ip, n := range counts {
		if n != per {
			t.Errorf("address %s: %d of its %d decisions kept", ip, n, per)
		}
	}
	if n := len(counts); n < keys/10*7/10 || n > keys/10*13/10 {
		t.Errorf("%d of %d keys kept at a share of 0.1", n, keys)
	}
}

// TestHashedValues: with a hash key, a value the config names exactly is
// kept, others are keyed hashes, the same for the same value, and a value
// that a wildcard matched becomes one that the wildcard matches again.
func TestHashedValues(t *testing.T) {
	var clk clock
	clk.set(t0)
	cfg := mustParse(t, testConfig)
	svc, l, path := logged(t, &clk, cfg, Options{HashKey: []byte("secret")})
	ctx := context.Background()
	req := &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("remote_address", "203.0.113.7"), desc("path", "/api/users"), desc("plan", "gold", "user", "alice")}}
	for range 2 {
		if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	raw, _ := os.ReadFile(path)
	for _, secret := range []string{"203.0.113.7", "users", "alice"} {
		if bytes.Contains(raw, []byte(secret)) {
			t.Errorf("the log holds %q:\n%s", secret, raw)
		}
	}
	recs := readAll(t, path)
	a, b := recs[1].Descriptors, recs[2].Descriptors
	if !recs[0].Hashed {
		t.Errorf("the header does not say the values are hashed")
	}
	ip, p, plan, user := a[0].Entries[0].Value, a[1].Entries[0].Value, a[2].Entries[0].Value, a[2].Entries[1].Value
	if len(ip) != tokenLen || ip[0] != '~' || ip != b[0].Entries[0].Value {
		t.Errorf("remote_address logged %q then %q, want the same token of %d bytes", ip, b[0].Entries[0].Value, tokenLen)
	}
	if plan != "gold" {
		t.Errorf("plan=gold logged %q: the config names it", plan)
	}
	if n := cfg.Domain("api").Match([]config.Entry{{Key: "path", Value: p}}); !strings.HasPrefix(p, "/api/~") || n == nil || n.Path != "path=/api/*" {
		t.Errorf("path /api/users logged %q, want a value that /api/* matches", p)
	}
	if user == "alice" || user[0] != '~' {
		t.Errorf("user logged %q, want a token", user)
	}
}

// blockingWriter blocks every Write until released, and says when the
// first one comes.
type blockingWriter struct {
	entered chan struct{}
	release chan struct{}
	once    atomic.Bool
	buf     bytes.Buffer
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	if w.once.CompareAndSwap(false, true) {
		close(w.entered)
	}
	<-w.release
	return w.buf.Write(p)
}

// TestFullQueueDrops: while the writer is stuck, decisions go on at once;
// the queue takes what it can hold and the rest is dropped and counted.
func TestFullQueueDrops(t *testing.T) {
	var clk clock
	clk.set(t0)
	w := &blockingWriter{entered: make(chan struct{}), release: make(chan struct{})}
	svc, l, _ := logged(t, &clk, mustParse(t, testConfig), Options{Path: "-", Stdout: w, Queue: 4})
	ctx := context.Background()
	req := &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("path", "/api/x")}}
	if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	<-w.entered // the writer flushes the first record, and is stuck there
	const n = 1000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute): // a hang guard, not a measure: decisions must not wait for the writer at all
		t.Fatal("decisions wait for a stuck decision log writer")
	}
	if st := l.Stats(); st.Dropped != n-4 {
		t.Errorf("stats while stuck %+v, want %d dropped (a queue of 4)", st, n-4)
	}
	close(w.release)
	l.Close()
	if st := l.Stats(); st.Written != 5 || st.Dropped != n-4 {
		t.Errorf("stats after %+v, want 5 written, %d dropped", st, n-4)
	}
	if lines := strings.Count(w.buf.String(), "\n"); lines != 6 {
		t.Errorf("%d lines written, want a header and 5 records", lines)
	}
}

// TestRotation: a file past its bound is renamed PATH.1 (PATH.1 to
// PATH.2...), at most Backups are kept, and each file starts with a
// header, so that the files read together give every record kept.
func TestRotation(t *testing.T) {
	var clk clock
	clk.set(t0)
	dir := t.TempDir()
	path := filepath.Join(dir, "d.log")
	svc, l, _ := logged(t, &clk, mustParse(t, testConfig), Options{Path: path, MaxBytes: 2000, Backups: 2})
	ctx := context.Background()
	for i := range 40 {
		if _, err := svc.ShouldRateLimit(ctx, &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("path", fmt.Sprintf("/api/%d", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	if st := l.Stats(); st.Rotated == 0 {
		t.Fatalf("stats %+v: no rotation", st)
	}
	if _, err := os.Stat(path + ".3"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s.3 exists: only 2 backups are kept", path)
	}
	var last int
	for _, p := range []string{path + ".2", path + ".1", path} {
		recs := readAll(t, p)
		if st, _ := os.Stat(p); st.Size() > 2000 {
			t.Errorf("%s: %d bytes, more than 2000", p, st.Size())
		}
		if recs[0].Kind != Header {
			t.Errorf("%s does not start with a header", p)
		}
		for _, r := range recs[1:] {
			var n int
			fmt.Sscanf(r.Descriptors[0].Entries[0].Value, "/api/%d", &n)
			if n != last+1 && last != 0 {
				t.Errorf("%s: record of /api/%d after /api/%d", p, n, last)
			}
			last = n
		}
	}
	if last != 39 {
		t.Errorf("the last record is /api/%d, want /api/39", last)
	}
}

// TestNewRefusesABadSample: the share of keys kept is in (0, 1].
func TestNewRefusesABadSample(t *testing.T) {
	for _, f := range []float64{-0.1, 1.5} {
		if _, err := New(Options{Path: "-", Stdout: &bytes.Buffer{}, Sample: f}); err == nil {
			t.Errorf("New(sample %v) = nil error", f)
		}
	}
}

// TestSampleKeepsGlobalLimitsWholeOrMarked: a global limit (one key that
// every request shares) is kept whole when its key is sampled in (every
// request that carries it is logged, with every other descriptor, those
// sampled out marked), and marked sampled in every record otherwise (its
// verdicts are as logged, its counts a sample's): never logged in part
// without the mark.
func TestSampleKeepsGlobalLimitsWholeOrMarked(t *testing.T) {
	const src = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: generic_key
    rate_limit: {unit: second, requests_per_unit: 1000}
`
	const share = 0.1
	shareOf := share // a variable: the product overflows a constant uint64
	threshold := uint64(shareOf * (1 << 64))
	global := func(v string) string {
		return string(engine.AppendDescriptorKey(nil, "api", []config.Entry{{Key: "generic_key", Value: v}}, nil))
	}
	var in, out string // a global key sampled in, and one sampled out
	for i := 0; in == "" || out == ""; i++ {
		v := fmt.Sprintf("global-%d", i)
		if sampleHash(global(v)) < threshold {
			in = cmp.Or(in, v)
		} else {
			out = cmp.Or(out, v)
		}
	}
	for _, g := range []struct {
		value string
		kept  bool
	}{{in, true}, {out, false}} {
		var clk clock
		clk.set(t0)
		svc, l, path := logged(t, &clk, mustParse(t, src), Options{Sample: share})
		const n = 3000
		for i := range n {
			ip := desc("remote_address", fmt.Sprintf("10.0.%d.%d", (i%1000)/256, (i%1000)%256))
			if _, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "api", Descriptors: []service.Descriptor{ip, desc("generic_key", g.value)}}); err != nil {
				t.Fatal(err)
			}
		}
		l.Close()
		recs := readAll(t, path)[1:]
		ips := 0
		for _, r := range recs {
			if r.Descriptors[1].Sampled == g.kept {
				t.Fatalf("global key %s (kept: %v): a record with its descriptor marked sampled=%v: %+v", g.value, g.kept, r.Descriptors[1].Sampled, r)
			}
			if !r.Descriptors[0].Sampled {
				ips++
			}
		}
		if g.kept && len(recs) != n {
			t.Errorf("global key %s sampled in: %d of its %d decisions logged, want all", g.value, len(recs), n)
		}
		if !g.kept && ips != len(recs) {
			t.Errorf("global key %s sampled out: %d records, %d of them for a kept address; want only those", g.value, len(recs), ips)
		}
		if frac := float64(ips) / n; frac < share/2 || frac > share*2 {
			t.Errorf("global key %s: %d of %d decisions logged for their address, far from a share of %v", g.value, ips, n, share)
		}
	}
}
