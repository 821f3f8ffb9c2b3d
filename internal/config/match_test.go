package config

import (
	"fmt"
	"strings"
	"testing"
)

// matchConfig is the tree the Match tests walk. Limits are left out where
// they do not matter: Match returns nodes.
const matchConfig = `domain: m
descriptors:
  - key: path
    value: /api/users
  - key: path
    value: /api/*
  - key: path
    value: /api/users*
  - key: path
    value: "*/action"
  - key: path
    value: /v*/items/*/x
  - key: path
  - key: a
    value: b_c
  - key: a_b
    value: c
  - key: glob
    value: ab*ba
  - key: any
    value: "*"
  - key: key1
    value: value1
    descriptors:
      - key: subkey
        value: special
  - key: key1
    descriptors:
      - key: subkey
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: user
        descriptors:
          - key: method
            value: GET
`

func TestMatch(t *testing.T) {
	d := parseString(t, matchConfig).Domain("m")
	e := func(kv ...string) []Entry {
		var out []Entry
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	tests := []struct {
		name    string
		entries []Entry
		want    string // the node's Path; "" for nil
	}{
		{"exact beats wildcard", e("path", "/api/users"), "path=/api/users"},
		{"wildcard beats value-less", e("path", "/api/orders"), "path=/api/*"},
		{"wildcards in file order", e("path", "/api/users/7"), "path=/api/*"},
		{"leading star", e("path", "/shop/action"), "path=*/action"},
		{"stars in the middle", e("path", "/v2/items/9/x"), "path=/v*/items/*/x"},
		{"star matches nothing", e("path", "/v/items//x"), "path=/v*/items/*/x"},
		{"segments in order", e("path", "/x/items/v/x"), "path"},
		{"value-less when no value matches", e("path", "/other"), "path"},
		{"empty value falls to value-less", e("path", ""), "path"},
		{"lone star matches empty", e("any", ""), "any=*"},
		{"lone star matches anything", e("any", "x*y"), "any=*"},
		{"prefix and suffix must not overlap", e("glob", "aba"), ""},
		{"prefix and suffix", e("glob", "abba"), "glob=ab*ba"},
		{"unknown key", e("nope", "x"), ""},
		{"no entries", nil, ""},
		// envoyproxy/ratelimit matches patterns against key+"_"+value, so
		// its "path" + "/api/*" also matches key "path_/api/x". Not here.
		{"wildcard stays within the value", e("path_/api/x", "z"), ""},
		{"key is not part of the value", e("path", "path_/api/x"), "path"},
		// The reference's composite identity key_value makes these the same.
		{"(a, b_c)", e("a", "b_c"), "a=b_c"},
		{"(a_b, c)", e("a_b", "c"), "a_b=c"},
		{"(a, b) is neither", e("a", "b"), ""},
		{"nested", e("tenant", "t1", "user", "u1", "method", "GET"), "tenant/user/method=GET"},
		{"node without limits still matches", e("tenant", "t1", "user", "u1"), "tenant/user"},
		{"node with limits and children", e("tenant", "t1"), "tenant"},
		{"deeper than the config", e("tenant", "t1", "user", "u1", "method", "GET", "extra", "x"), ""},
		{"no backtracking: exact branch chosen, subkey misses", e("key1", "value1", "subkey", "x"), ""},
		{"value-less branch", e("key1", "other", "subkey", "x"), "key1/subkey"},
		{"exact branch hit", e("key1", "value1", "subkey", "special"), "key1=value1/subkey=special"},
		{"entry order matters", e("user", "u1", "tenant", "t1"), ""},
	}
	for _, tt := range tests {
		got := d.Match(tt.entries)
		gotPath := ""
		if got != nil {
			gotPath = got.Path
		}
		if gotPath != tt.want {
			t.Errorf("%s: Match(%v) = %q, want %q", tt.name, tt.entries, gotPath, tt.want)
		}
	}
	var nilDomain *Domain
	if got := nilDomain.Match(e("path", "/")); got != nil {
		t.Errorf("(*Domain)(nil).Match = %v, want nil", got)
	}
}

// TestMatchDoesNotAllocate: Match is on every request's path.
func TestMatchDoesNotAllocate(t *testing.T) {
	d := parseString(t, matchConfig).Domain("m")
	requests := [][]Entry{
		{{Key: "path", Value: "/api/users"}},
		{{Key: "path", Value: "/v2/items/9/x"}},
		{{Key: "path", Value: "/nothing"}},
		{{Key: "tenant", Value: "t"}, {Key: "user", Value: "u"}, {Key: "method", Value: "GET"}},
		{{Key: "nope", Value: "x"}},
	}
	for _, entries := range requests {
		if n := testing.AllocsPerRun(100, func() { d.Match(entries) }); n != 0 {
			t.Errorf("Match(%v) allocates %v times, want 0", entries, n)
		}
	}
}

func BenchmarkMatch(b *testing.B) {
	var cfg strings.Builder
	cfg.WriteString("domain: bench\ndescriptors:\n")
	for i := range 100 {
		fmt.Fprintf(&cfg, "  - {key: user, value: u%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	for i := range 10 {
		fmt.Fprintf(&cfg, "  - {key: path, value: \"/svc%d/*/items/*\", rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	cfg.WriteString(`  - {key: path, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 1}}
  - key: tenant
    descriptors:
      - key: user
        descriptors:
          - {key: method, value: GET, rate_limit: {unit: second, requests_per_unit: 1}}
`)
	c, err := Parse("bench.yaml", []byte(cfg.String()))
	if err != nil {
		b.Fatal(err)
	}
	d := c.Domain("bench")
	shapes := []struct {
		name    string
		entries []Entry
	}{
		{"exact", []Entry{{Key: "user", Value: "u57"}}},
		{"value-less", []Entry{{Key: "remote_address", Value: "203.0.113.7"}}},
		{"wildcard-last-of-10", []Entry{{Key: "path", Value: "/svc9/v1/items/42"}}},
		{"wildcard-miss-to-value-less", []Entry{{Key: "path", Value: "/health"}}},
		{"nested-3", []Entry{{Key: "tenant", Value: "acme"}, {Key: "user", Value: "bob"}, {Key: "method", Value: "GET"}}},
		{"miss", []Entry{{Key: "unknown", Value: "x"}}},
	}
	for _, s := range shapes {
		if d.Match(s.entries) == nil && s.name != "miss" {
			b.Fatalf("%s: Match = nil", s.name)
		}
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d.Match(s.entries)
			}
		})
	}
}
