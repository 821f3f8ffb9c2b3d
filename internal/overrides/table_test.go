package overrides

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

const testConfig = `
domain: api
descriptors:
  - key: tenant
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: day, requests_per_unit: 1000, name: daily}
  - key: tenant
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: "corp-*"
    rate_limit: {unit: minute, requests_per_unit: 40}
  - key: key
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 5}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_log}
  - key: user
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
  - key: bare
---
domain: other
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
`

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// fixture is a keeper on a memory backend, bound to testConfig, whose
// clock the test moves.
type fixture struct {
	k   *Keeper
	cfg *config.Config
	now time.Time
}

func newFixture(t testing.TB, path string) *fixture {
	t.Helper()
	cfg, err := config.Parse("limits.yaml", []byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{cfg: cfg, now: t0}
	m, err := NewMemory(path, f.clock)
	if err != nil {
		t.Fatal(err)
	}
	f.k = New(m, Options{Now: f.clock})
	if err := f.k.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.k.Bind(cfg)
	return f
}

func (f *fixture) clock() time.Time { return f.now }

// entries parses "k=v,k=v".
func entries(s string) []engine.Entry {
	var out []engine.Entry
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		out = append(out, engine.Entry{Key: k, Value: v})
	}
	return out
}

func (f *fixture) set(t *testing.T, desc, name string, rpu uint32) {
	t.Helper()
	c := Change{Key: Key{Domain: "api", Descriptor: entries(desc), Name: name}, RequestsPerUnit: rpu}
	if _, err := f.k.Set(context.Background(), c, "test"); err != nil {
		t.Fatalf("Set(%s %q, %d): %v", desc, name, rpu, err)
	}
}

// limitOf returns what a descriptor desc of api, matched in the config,
// counts with for its limit labelled label: its requests_per_unit.
func (f *fixture) limitOf(t *testing.T, desc, label string) uint32 {
	t.Helper()
	es := entries(desc)
	node := f.cfg.Domain("api").Match(es)
	if node == nil {
		t.Fatalf("%s matches no node", desc)
	}
	for _, l := range node.Limits {
		if l.Label == label || l.Name == label {
			got := f.k.Table(f.cfg).Apply("api", es, l)
			if got.Rule.ID != l.Rule.ID || got.Label != l.Label || got.Index != l.Index {
				t.Fatalf("%s %s: the override changed the limit's identity: %s %s %d, want %s %s %d", desc, label, got.Rule.ID, got.Label, got.Index, l.Rule.ID, l.Label, l.Index)
			}
			return got.Rule.Limit
		}
	}
	t.Fatalf("%s: no limit %s on %s", desc, label, node.Path)
	return 0
}

// TestPrecedence: of the overrides that match a descriptor, the most
// specific applies, entry by entry from the first: exact beats prefix,
// longer prefix beats shorter; at equal entries one that names the limit
// beats one that names none. Each step sets one more override and reads
// what several descriptors count with.
func TestPrecedence(t *testing.T) {
	f := newFixture(t, "")
	type read struct {
		desc, limit string
		want        uint32
	}
	steps := []struct {
		desc, name string
		rpu        uint32
		reads      []read
	}{
		{"tenant=*", "", 5, []read{{"tenant=acme-1", "tenant/1m", 5}, {"tenant=acme-1", "daily", 5}, {"tenant=vip", "tenant=vip/1m", 5}, {"tenant=corp-x", "tenant=corp-*/1m", 5}}},
		{"tenant=acme-*", "", 20, []read{{"tenant=acme-1", "tenant/1m", 20}, {"tenant=acmf", "tenant/1m", 5}, {"tenant=acme-", "tenant/1m", 20}}},
		{"tenant=acme-eu-*", "", 30, []read{{"tenant=acme-eu-1", "tenant/1m", 30}, {"tenant=acme-us-1", "tenant/1m", 20}}},
		{"tenant=acme-1", "", 50, []read{{"tenant=acme-1", "tenant/1m", 50}, {"tenant=acme-1", "daily", 50}, {"tenant=acme-2", "tenant/1m", 20}}},
		// A named override beats the unnamed one of the same descriptor,
		// for its limit only.
		{"tenant=acme-1", "daily", 5000, []read{{"tenant=acme-1", "daily", 5000}, {"tenant=acme-1", "tenant/1m", 50}}},
		// The descriptor comes first: the exact unnamed override of
		// acme-1 beats a prefix that names daily.
		{"tenant=acme-eu-*", "daily", 7000, []read{{"tenant=acme-eu-1", "daily", 7000}, {"tenant=acme-1", "daily", 5000}, {"tenant=acme-eu-1", "tenant/1m", 30}}},
		// Two entries: the first entry decides before the second.
		{"user=u*,path=/a", "", 7, []read{{"user=u1,path=/a", "user/path/1m", 7}, {"user=u1,path=/b", "user/path/1m", 3}}},
		{"user=u1,path=*", "", 8, []read{{"user=u1,path=/a", "user/path/1m", 8}, {"user=u2,path=/a", "user/path/1m", 7}}},
		// Replacing an override changes its values.
		{"tenant=acme-*", "", 21, []read{{"tenant=acme-2", "tenant/1m", 21}}},
		// 0 blocks.
		{"tenant=blocked", "", 0, []read{{"tenant=blocked", "tenant/1m", 0}, {"tenant=blocked", "daily", 0}}},
	}
	for i, s := range steps {
		f.set(t, s.desc, s.name, s.rpu)
		for _, r := range s.reads {
			if got := f.limitOf(t, r.desc, r.limit); got != r.want {
				t.Errorf("step %d (set %s %q = %d): %s's %s counts with %d, want %d", i+1, s.desc, s.name, s.rpu, r.desc, r.limit, got, r.want)
			}
		}
	}
	// No override applies to another number of entries, another key or
	// another domain.
	if got := f.limitOf(t, "key=k1", "key/1s"); got != 5 {
		t.Errorf("key=k1: %d, want the config's 5", got)
	}
}

// TestRefused: an override that matches no limit of the loaded config,
// or whose values do not fit a limit it matches, is refused, saying why;
// a bad key names its field.
func TestRefused(t *testing.T) {
	f := newFixture(t, "")
	for _, tc := range []struct {
		domain, desc, name string
		rpu                uint32
		burst              engine.Opt[uint32]
		want               string // in the error
		field              bool   // a *FieldError rather than a *RefusedError
	}{
		{"nope", "tenant=a", "", 1, engine.Opt[uint32]{}, `no domain "nope"`, false},
		{"api", "nokey=a", "", 1, engine.Opt[uint32]{}, `reaches no node of domain "api"`, false},
		{"api", "user=u1", "", 1, engine.Opt[uint32]{}, `reaches user, which has no limit that counts`, false},
		{"api", "free=x", "", 1, engine.Opt[uint32]{}, `reaches free, which has no limit that counts`, false},
		{"api", "bare=x", "", 1, engine.Opt[uint32]{}, `reaches bare, which has no limit that counts`, false},
		{"api", "tenant=a", "weekly", 1, engine.Opt[uint32]{}, `no limit named "weekly"`, false},
		{"api", "user=u1,path=/a,x=y", "", 1, engine.Opt[uint32]{}, `reaches no node`, false},
		{"api", "tenant=a", "", 1, engine.Some[uint32](3), `burst: it is for token_bucket limits`, false},
		{"api", "log=a", "", engine.MaxSlidingLog + 1, engine.Opt[uint32]{}, `limit log/1m (sliding_log): requests_per_unit 100001 is too large`, false},
		{"api", "key=a", "", 10, engine.Some[uint32](0), `burst must be at least 1`, false},
		{"api", "tenant=a*b", "", 1, engine.Opt[uint32]{}, `descriptor[0].value: "a*b": '*' may only end a value`, true},
		{"api", "=a", "", 1, engine.Opt[uint32]{}, `descriptor[0].key: must not be empty`, true},
	} {
		c := Change{Key: Key{Domain: tc.domain, Descriptor: entries(tc.desc), Name: tc.name}, RequestsPerUnit: tc.rpu, Burst: tc.burst}
		_, err := f.k.Set(context.Background(), c, "test")
		var re *RefusedError
		var fe *FieldError
		switch {
		case err == nil:
			t.Errorf("Set(%s %s %q): accepted, want refused with %q", tc.domain, tc.desc, tc.name, tc.want)
		case !strings.Contains(err.Error(), tc.want):
			t.Errorf("Set(%s %s %q): %v, want it to say %q", tc.domain, tc.desc, tc.name, err, tc.want)
		case tc.field && !errors.As(err, &fe), !tc.field && !errors.As(err, &re):
			t.Errorf("Set(%s %s %q): %T, want a field error %v", tc.domain, tc.desc, tc.name, err, tc.field)
		}
	}
	if n := len(f.k.List("")); n != 0 {
		t.Errorf("%d overrides kept after refusals, want 0", n)
	}
	// A prefix that covers a node with limits is accepted: "corp-*" is a
	// wildcard node whose head agrees with "co*".
	f.set(t, "tenant=co*", "", 9)
	if got := f.limitOf(t, "tenant=corp-1", "tenant=corp-*/1m"); got != 9 {
		t.Errorf("tenant=corp-1: %d, want 9", got)
	}
}

// TestTokenBucketBurst: an override of a token bucket gives it a burst:
// the one given, else its requests_per_unit (as the grammar's default).
func TestTokenBucketBurst(t *testing.T) {
	f := newFixture(t, "")
	es := entries("key=k1")
	l := f.cfg.Domain("api").Match(es).Limits[0]
	for i, tc := range []struct {
		burst     engine.Opt[uint32]
		rpu, want uint32
	}{
		{engine.Opt[uint32]{}, 50, 50},
		{engine.Some[uint32](200), 50, 200},
		{engine.Opt[uint32]{}, 0, 0},
	} {
		c := Change{Key: Key{Domain: "api", Descriptor: es}, RequestsPerUnit: tc.rpu, Burst: tc.burst}
		if _, err := f.k.Set(context.Background(), c, "test"); err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		got := f.k.Table(f.cfg).Apply("api", es, l).Rule
		if got.Limit != tc.rpu || got.Burst != tc.want {
			t.Errorf("step %d: rpu %d burst %v: the bucket counts %d burst %d, want %d burst %d", i+1, tc.rpu, tc.burst, got.Limit, got.Burst, tc.rpu, tc.want)
		}
	}
}
