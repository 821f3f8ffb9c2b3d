package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/overrides"
)

const overridesConfig = `
domain: api
descriptors:
  - key: tenant
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 1000, name: hourly}
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// overridesFixture is a service on a memory store with a keeper of
// overrides on a memory backend, both on one clock the test moves.
type overridesFixture struct {
	key   string // the descriptor key of set and decide: tenant
	svc   *Service
	keep  *overrides.Keeper
	clock *storetest.Clock
}

func newOverridesFixture(t testing.TB) *overridesFixture {
	t.Helper()
	cfg, err := config.Parse("limits.yaml", []byte(overridesConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := &overridesFixture{key: "tenant", clock: storetest.NewClock(storetest.T0)}
	ms := memstore.New(memstore.Options{Now: f.clock.Now})
	t.Cleanup(func() { ms.Close() })
	mem, err := overrides.NewMemory("", f.clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	f.keep = overrides.New(mem, overrides.Options{Now: f.clock.Now})
	if err := f.keep.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.svc = New(Options{Store: ms, Overrides: f.keep, Headers: HeadersDraft03})
	f.svc.SetConfig(cfg)
	return f
}

func (f *overridesFixture) set(t testing.TB, value, name string, rpu uint32, ttl time.Duration) {
	t.Helper()
	c := overrides.Change{Key: overrides.Key{Domain: "api", Descriptor: []engine.Entry{{Key: f.key, Value: value}}, Name: name}, RequestsPerUnit: rpu, TTL: ttl}
	if _, err := f.keep.Set(context.Background(), c, "test"); err != nil {
		t.Fatalf("set %s=%s %q = %d: %v", f.key, value, name, rpu, err)
	}
}

func (f *overridesFixture) decide(t testing.TB, value string, hits uint64) *Response {
	t.Helper()
	d := desc(f.key, value)
	d.HasHits, d.Hits = true, hits
	resp, err := f.svc.ShouldRateLimit(context.Background(), &Request{Domain: "api", Descriptors: []Descriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestOverridesInDecisions: an override changes the limit of the next
// decision on the same counter: raised, lowered below what the window has
// used (denied until the window frees room), 0 (every request denied),
// expired by its ttl, deleted; the answer's limit and headers are the
// override's.
func TestOverridesInDecisions(t *testing.T) {
	f := newOverridesFixture(t)
	f.key = "team" // one limit
	type step struct {
		what      string
		do        func()
		hits      uint64
		want      Code
		limit     uint32 // the binding limit's requests_per_unit
		remaining uint32
	}
	steps := []step{
		{"4 hits under the config's 10/min", nil, 4, OK, 10, 6},
		{"raised to 20: the counter goes on", func() { f.set(t, "acme", "", 20, 0) }, 1, OK, 20, 15},
		{"15 more fit", nil, 15, OK, 20, 0},
		{"lowered to 12, below the 20 used", func() { f.set(t, "acme", "", 12, 0) }, 1, OverLimit, 12, 0},
		{"0 blocks", func() { f.set(t, "acme", "", 0, 0) }, 1, OverLimit, 0, 0},
		{"the next minute: still 0", func() { f.clock.Set(f.clock.Now().Add(time.Minute)) }, 1, OverLimit, 0, 0},
		{"deleted: the config's 10", func() { f.delete(t, "acme") }, 3, OK, 10, 7},
		{"a temporary raise to 30 for 20s", func() { f.set(t, "acme", "", 30, 20*time.Second) }, 20, OK, 30, 7},
		{"it expires: the config's 10 again, 23 used", func() { f.clock.Set(f.clock.Now().Add(20 * time.Second)) }, 1, OverLimit, 10, 0},
		{"a prefix covers acme too, exact beats it", func() { f.set(t, "ac*", "", 5, 0); f.set(t, "acme", "", 40, 0) }, 1, OK, 40, 16},
	}
	for i, s := range steps {
		if s.do != nil {
			s.do()
		}
		resp := f.decide(t, "acme", s.hits)
		st := resp.Statuses[0]
		if resp.Code != s.want || st.Limit == nil || st.Limit.Rule.Limit != s.limit || st.Remaining != s.remaining {
			lim := uint32(0)
			if st.Limit != nil {
				lim = st.Limit.Rule.Limit
			}
			t.Errorf("step %d (%s): %d hits: %s, limit %d, remaining %d; want %s, limit %d, remaining %d",
				i+1, s.what, s.hits, resp.Code, lim, st.Remaining, s.want, s.limit, s.remaining)
		}
	}
	// The headers advertise the override's limit.
	resp := f.decide(t, "acme", 0)
	if got := headerOf(resp, headerXLimit); got == "" || got[:2] != "40" {
		t.Errorf("X-RateLimit-Limit %q, want the override's 40 first", got)
	}
	// Another tenant under the prefix gets it; on a node of two limits,
	// both (the override names no limit).
	resp = f.decide(t, "acorn", 1)
	if got := resp.Statuses[0].Limit.Rule.Limit; got != 5 {
		t.Errorf("team=acorn: counts with %d, want the prefix's 5", got)
	}
	f.key = "tenant"
	f.set(t, "ac*", "", 5, 0)
	resp = f.decide(t, "acorn", 1)
	if len(resp.Statuses[0].Policies) != 2 {
		t.Fatalf("tenant=acorn: %d policies, want 2", len(resp.Statuses[0].Policies))
	}
	for _, p := range resp.Statuses[0].Policies {
		if p.Limit.Rule.Limit != 5 {
			t.Errorf("tenant=acorn: %s counts with %d, want the prefix's 5", p.Limit.Label, p.Limit.Rule.Limit)
		}
	}
}

func (f *overridesFixture) delete(t testing.TB, value string) {
	t.Helper()
	k := overrides.Key{Domain: "api", Descriptor: []engine.Entry{{Key: f.key, Value: value}}}
	if _, err := f.keep.Delete(context.Background(), k, "test"); err != nil {
		t.Fatalf("delete %s=%s: %v", f.key, value, err)
	}
}

func headerOf(resp *Response, name string) string {
	for _, h := range resp.Headers {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

// TestRequestLimitWinsOverOverride: a descriptor that carries its own
// limit (Envoy Gateway's fromMetadata) is decided by it: the config is
// not consulted, so no runtime override applies to it.
func TestRequestLimitWinsOverOverride(t *testing.T) {
	f := newOverridesFixture(t)
	f.set(t, "acme", "", 0, 0) // blocks the configured limits
	d := desc("tenant", "acme")
	d.Override = &Override{RequestsPerUnit: 3, Unit: engine.Minute}
	for i, want := range []Code{OK, OK, OK, OverLimit} {
		resp, err := f.svc.ShouldRateLimit(context.Background(), &Request{Domain: "api", Descriptors: []Descriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != want || resp.Statuses[0].Limit.Rule.Limit != 3 {
			t.Errorf("request %d with its own limit 3/min: %s with %d, want %s with 3", i+1, resp.Code, resp.Statuses[0].Limit.Rule.Limit, want)
		}
	}
	if resp := f.decide(t, "acme", 1); resp.Code != OverLimit {
		t.Errorf("without its own limit: %s, want OVER_LIMIT (the override blocks)", resp.Code)
	}
}

// TestExplainShowsOverride: /debug/explain's limit in force carries the
// override, and its policy is the override's.
func TestExplainShowsOverride(t *testing.T) {
	f := newOverridesFixture(t)
	f.set(t, "acme", "hourly", 5000, time.Hour)
	ex, err := f.svc.Explain(context.Background(), &Request{Domain: "api", Descriptors: []Descriptor{desc("tenant", "acme")}})
	if err != nil {
		t.Fatal(err)
	}
	lims := ex.Descriptors[0].Limits
	if len(lims) != 2 || lims[0].Override != nil || lims[1].Override == nil {
		t.Fatalf("limits %+v: want the minute without override, hourly with", lims)
	}
	o := lims[1].Override
	if o.RequestsPerUnit != 5000 || !o.ExpiresAt.Equal(storetest.T0.Add(time.Hour)) || lims[1].Policy.Quota != 5000 || lims[1].Limit.Rule.Limit != 5000 {
		t.Errorf("hourly: override %+v, policy %+v; want 5000 until T0+1h", o, lims[1].Policy)
	}
}

// TestOverridesAllocateNothing: a decision through a table of overrides
// (hit or miss) allocates what one without overrides does.
func TestOverridesAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops scratch: make test counts allocations in a run without -race")
	}
	// Without headers: they format numbers, whose allocations vary with
	// their digits.
	plain := newOverridesFixture(t)
	over := newOverridesFixture(t)
	plain.svc.headers, over.svc.headers = HeadersOff, HeadersOff
	for i := range 100 {
		over.set(t, fmt.Sprintf("t%03d", i), "", 20, 0)
		over.set(t, fmt.Sprintf("p%02d*", i), "hourly", 2000, time.Hour)
	}
	for _, value := range []string{"t042", "p42x", "nobody"} {
		base := testing.AllocsPerRun(200, func() { plain.decide(t, value, 1) })
		got := testing.AllocsPerRun(200, func() { over.decide(t, value, 1) })
		if got != base {
			t.Errorf("tenant=%s: %v allocations with overrides, %v without; want the same", value, got, base)
		}
	}
}

// BenchmarkShouldRateLimitOverrides: a decision on a memory store with 0,
// 1,000 and 100,000 overrides in its domain (half exact values, half
// prefixes), for a descriptor that an exact override matches, one that a
// prefix matches, and one that none does: the overrides cost a decision
// the same whatever their number, and no allocation.
func BenchmarkShouldRateLimitOverrides(b *testing.B) {
	cfg, err := config.Parse("limits.yaml", []byte(`
domain: api
descriptors:
  - key: tenant
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000, name: hourly}
`))
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{0, 1000, 100000} {
		// The overrides as a file of the memory backend: one load.
		var file strings.Builder
		file.WriteString(`{"version": 1, "overrides": [`)
		for i := range n {
			v := fmt.Sprintf("t%06d", i)
			if i%2 == 1 {
				v = fmt.Sprintf("p%06d-*", i)
			}
			if i > 0 {
				file.WriteString(",")
			}
			fmt.Fprintf(&file, `{"domain":"api","descriptor":[{"key":"tenant","value":%q}],"requests_per_unit":2000000000,"updated_at":"2030-01-01T00:00:00Z"}`, v)
		}
		file.WriteString("]}")
		path := filepath.Join(b.TempDir(), "overrides.json")
		if err := os.WriteFile(path, []byte(file.String()), 0o644); err != nil {
			b.Fatal(err)
		}
		mem, err := overrides.NewMemory(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		keep := overrides.New(mem, overrides.Options{})
		if err := keep.Load(context.Background()); err != nil {
			b.Fatal(err)
		}
		ms := memstore.New(memstore.Options{})
		b.Cleanup(func() { ms.Close() })
		svc := New(Options{Store: ms, Overrides: keep, Observers: []Observer{nopObserver{}}})
		svc.SetConfig(cfg)
		for _, shape := range []struct{ name, value string }{
			{"exact", fmt.Sprintf("t%06d", n/2/2*2)},
			{"prefix", fmt.Sprintf("p%06d-eu-1", n/2/2*2+1)},
			{"miss", "nobody-at-all"},
		} {
			req := &Request{Domain: "api", Descriptors: []Descriptor{desc("tenant", shape.value)}}
			resp, err := svc.ShouldRateLimit(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			if hit := resp.Statuses[0].Limit.Rule.Limit == 2000000000; hit != (n > 0 && shape.name != "miss") {
				b.Fatalf("overrides=%d %s: override applied %v", n, shape.name, hit)
			}
			b.Run(fmt.Sprintf("overrides=%d/%s", n, shape.name), func(b *testing.B) {
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
