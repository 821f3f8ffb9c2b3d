package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/httpdesc"
)

// FuzzParse: Parse never panics; it returns a config or an ErrorList of
// positioned errors, and a config it returns dumps and matches.
func FuzzParse(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	bad, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range append(append(seeds, bad...), filepath.Join("..", "..", "config", "limits.yaml")) {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	client := netip.MustParseAddr("10.0.0.1")
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned a Config with an error")
			}
			list, ok := err.(ErrorList)
			if !ok || len(list) == 0 {
				t.Fatalf("Parse error %T %v, want a non-empty ErrorList", err, err)
			}
			for _, e := range list {
				if e.File != "fuzz.yaml" || e.Line < 1 || e.Column < 1 || !strings.HasPrefix(e.Error(), "fuzz.yaml:") {
					t.Fatalf("badly placed error %+v", e)
				}
			}
			return
		}
		if _, err := c.MarshalJSON(); err != nil {
			t.Fatalf("MarshalJSON: %v", err)
		}
		for i, l := range c.Limits() {
			if l.Index != i || l.Descriptor == nil || l.ID() == "" || l.Label == "" || l.Rule == nil && !l.Unlimited {
				t.Fatalf("limit %d: %+v", i, l)
			}
		}
		for _, d := range c.Domains() {
			for _, n := range d.Descriptors {
				if got := d.Match([]Entry{{Key: n.Key, Value: n.Value}}); got == nil {
					t.Fatalf("Match(%s=%s) = nil for a configured top-level node", n.Key, n.Value)
				}
			}
			d.HTTPDescriptors.Build(&httpdesc.StaticRequest{Client: client, Path: "/a?b=c", Method: "GET"}, nil)
		}
	})
}

// FuzzMatch: matching never panics, the node reached belongs to the last
// entry's key at the right depth, and a wildcard node matched the value
// alone (never key and value joined, a defect of the reference).
func FuzzMatch(f *testing.F) {
	cfg, err := Parse("m.yaml", []byte(`
domain: d
descriptors:
  - key: path
    value: /api/*/items/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "*.json"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a_b
    value: c
    rate_limit: {unit: second, requests_per_unit: 1}
`))
	if err != nil {
		f.Fatal(err)
	}
	d := cfg.Domain("d")
	f.Add("path", "/api/v1/items/7", "", "")
	f.Add("path_/api/x", "items/y", "", "")
	f.Add("path", "x", "method", "GET")
	f.Add("a", "b_c", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		if len(v1)+len(v2) > 256 {
			return // bounded work per input
		}
		entries := []Entry{{Key: k1, Value: v1}}
		if k2 != "" {
			entries = append(entries, Entry{Key: k2, Value: v2})
		}
		n := d.Match(entries)
		if n == nil {
			return
		}
		last := entries[len(entries)-1]
		if n.Key != last.Key || n.Depth != len(entries)-1 {
			t.Fatalf("Match(%q) reached %q at depth %d", entries, n.Path, n.Depth)
		}
		if n.Wildcard && !globRegexp(n.Value).MatchString(last.Value) {
			t.Fatalf("Match(%q) reached wildcard %q, which does not match the value %q", entries, n.Value, last.Value)
		}
		if !n.Wildcard && n.Value != "" && n.Value != last.Value {
			t.Fatalf("Match(%q) reached %q for the value %q", entries, n.Path, last.Value)
		}
	})
}

// globRegexp is a '*' pattern as an anchored regular expression, each '*'
// any run of bytes: a reference that shares nothing with the match index.
func globRegexp(pattern string) *regexp.Regexp {
	parts := strings.Split(pattern, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`(?s)^` + strings.Join(parts, ".*") + `$`)
}
