package topkeys

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/service"
)

// decide tells keys of one decision of limit l on the descriptor
// remote_address=value, denied or not, at remaining.
func decide(keys *Keys, state any, dom *config.Domain, l *config.Limit, value string, admitted bool, remaining uint64) {
	entries := []config.Entry{{Key: "remote_address", Value: value}}
	req := &service.Request{Domain: dom.Name, Descriptors: []service.Descriptor{{Entries: entries}}}
	d := &service.Decision{Request: req, Domain: dom,
		Items:   []engine.Item{{Desc: string(engine.AppendDescriptorKey(nil, dom.Name, entries, nil)), Rule: l.Rule, Hits: 1}},
		Limits:  []*config.Limit{l},
		Owners:  []int{0},
		Results: []engine.Result{{Admitted: admitted, Remaining: remaining}},
	}
	keys.Decided(state, d)
}

// oneLimit returns the top keys on clk of a config whose domain api has
// one limit (rate_limit: {spec}) on remote_address, the state of that
// config, the domain and the limit.
func oneLimit(t *testing.T, clk *clock, spec string) (*Keys, any, *config.Domain, *config.Limit) {
	t.Helper()
	cfg := mustParse(t, "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {"+spec+"}\n")
	dom := cfg.Domain("api")
	keys := New(Options{Now: clk.now})
	return keys, keys.ForConfig(cfg), dom, dom.Descriptors[0].Limits[0]
}

// TestMemoryWithAMillionKeys: a million distinct keys, half denied once,
// half each a little fuller than the last, churn through both rankings of
// one limit; the sketch keeps 2K entries at most, holds no more than
// MaxBytes, and the heap grows by no more than that.
func TestMemoryWithAMillionKeys(t *testing.T) {
	var clk clock
	clk.set(t0)
	keys, state, dom, l := oneLimit(t, &clk, "unit: hour, requests_per_unit: 1000000")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 1_000_000
	long := string(make([]byte, 300)) // values beyond the shown bound, too
	for i := range n {
		v := "203.0." + strconv.Itoa(i)
		if i%10 == 0 {
			v += long
		}
		// Every other key denied (and new to the denied ranking, so it
		// displaces one); the others admitted, each fuller than any before
		// (so it displaces one in the fullness ranking).
		if i%2 == 0 {
			decide(keys, state, dom, l, v, false, n)
		} else {
			decide(keys, state, dom, l, v, true, uint64(n-i))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	ls := state.(*configSet).byIndex[l.Index]
	sk := ls.sk
	if len(sk.byID) != 2*keys.K() || len(sk.denied.items) != keys.K() || len(sk.full.items) != keys.K() {
		t.Errorf("after %d keys: %d entries (%d denied, %d full), want 2K = %d", n, len(sk.byID), len(sk.denied.items), len(sk.full.items), 2*keys.K())
	}
	if sk.bytes > keys.MaxBytes() {
		t.Errorf("after %d keys the sketch holds %d bytes, more than its cap %d", n, sk.bytes, keys.MaxBytes())
	}
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	// The heap also holds the config's set and the map's buckets, whose
	// size follows the most keys held at once (2K).
	if slack := int64(64 << 10); grew > keys.MaxBytes()+slack {
		t.Errorf("the heap grew by %d bytes over %d keys, more than the cap %d + %d", grew, n, keys.MaxBytes(), slack)
	}
	t.Logf("K=%d: cap %d bytes per limit; after %d distinct keys the sketch holds %d bytes in %d entries, the heap grew %d bytes", keys.K(), keys.MaxBytes(), n, sk.bytes, len(sk.byID), grew)
	if sk.denials != n/2 {
		t.Errorf("denials counted %d, want %d", sk.denials, n/2)
	}
}

// TestWindowRolls: a decision in the next window starts the sketch over.
func TestWindowRolls(t *testing.T) {
	var clk clock
	clk.set(t0.Add(59 * time.Second))
	keys, state, dom, l := oneLimit(t, &clk, "unit: minute, requests_per_unit: 1")
	decide(keys, state, dom, l, "a", false, 0)
	res, _ := keys.Top(t.Context(), Query{})
	if len(res.Limits) != 1 || len(res.Limits[0].Keys) != 1 || !res.Limits[0].WindowStart.Equal(t0) {
		t.Fatalf("Top at +59s: %+v, want key a in the window from %s", res, t0)
	}
	clk.set(t0.Add(time.Minute))
	if res, _ := keys.Top(t.Context(), Query{}); len(res.Limits[0].Keys) != 0 || !res.Limits[0].WindowStart.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Top at +1m, before any decision: %+v, want no key in the window from %s", res.Limits[0], t0.Add(time.Minute))
	}
	decide(keys, state, dom, l, "b", false, 0)
	res, _ = keys.Top(t.Context(), Query{})
	if k := res.Limits[0].Keys; len(k) != 1 || k[0].Entries[0].Value != "b" || res.Limits[0].Denials != 1 {
		t.Fatalf("Top at +1m: %+v, want key b alone", res.Limits[0])
	}
}

// BenchmarkDecided is the observer's cost per decision of one limit on a
// key that the sketch holds.
func BenchmarkDecided(b *testing.B) {
	cfg, _ := config.Parse("b.yaml", []byte(`
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 1000000}
`))
	dom := cfg.Domain("api")
	l := dom.Descriptors[0].Limits[0]
	keys := New(Options{})
	state := keys.ForConfig(cfg)
	entries := []config.Entry{{Key: "remote_address", Value: "10.0.0.1"}}
	d := &service.Decision{Request: &service.Request{Domain: "api", Descriptors: []service.Descriptor{{Entries: entries}}}, Domain: dom,
		Items:   []engine.Item{{Desc: string(engine.AppendDescriptorKey(nil, "api", entries, nil)), Rule: l.Rule, Hits: 1}},
		Limits:  []*config.Limit{l},
		Owners:  []int{0},
		Results: []engine.Result{{Admitted: true, Remaining: 10}},
	}
	b.ReportAllocs()
	for b.Loop() {
		keys.Decided(state, d)
	}
}
