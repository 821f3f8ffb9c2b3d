package config

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestWildcardIndexAgreesWithFileOrder: on random patterns and values over
// a small alphabet (so that they collide often), the index picks exactly
// the first pattern in file order that matches, as a plain scan does.
func TestWildcardIndexAgreesWithFileOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	word := func(alphabet string, maxLen int) string {
		b := make([]byte, rng.IntN(maxLen+1))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	for round := range 300 {
		var nodes []*Descriptor
		seen := make(map[string]bool)
		for range 1 + rng.IntN(40) {
			p := word("ab*", 7)
			if !strings.Contains(p, "*") {
				p += "*"
			}
			if seen[p] {
				continue
			}
			seen[p] = true
			nodes = append(nodes, &Descriptor{Key: "k", Value: p, Wildcard: true, segs: strings.Split(p, "*")})
		}
		ix := newWildcardIndex(nodes)
		for range 100 {
			v := word("ab", 9)
			var want *Descriptor
			for _, n := range nodes {
				if globMatch(n.Value, v) {
					want = n
					break
				}
			}
			if got := ix.lookup(v); got != want {
				var patterns []string
				for _, n := range nodes {
					patterns = append(patterns, n.Value)
				}
				t.Fatalf("round %d: patterns %q: lookup(%q) = %v, want %v", round, patterns, v, got, want)
			}
		}
	}
}

// TestWildcardIndexShapes: prefixes and suffixes that nest, split radix
// edges and share both ends keep file order.
func TestWildcardIndexShapes(t *testing.T) {
	patterns := []string{"/api/users/*", "/api/*", "/api/*/x", "*.example.com", "/a*b*c", "/a*c", "/ap*", "*"}
	var nodes []*Descriptor
	for _, p := range patterns {
		nodes = append(nodes, &Descriptor{Key: "k", Value: p, Wildcard: true, segs: strings.Split(p, "*")})
	}
	ix := newWildcardIndex(nodes)
	tests := []struct{ value, want string }{
		{"/api/users/7", "/api/users/*"},
		{"/api/users", "/api/*"},
		{"/api/v1/x", "/api/*"},
		{"www.example.com", "*.example.com"},
		{"/abc", "/a*b*c"},
		{"/ac", "/a*c"},
		{"/apx", "/ap*"},
		{"", "*"},
		{"other", "*"},
		{"/a", "*"}, // a prefix of /a*c and /ap* only
	}
	for _, tt := range tests {
		got := ix.lookup(tt.value)
		if got == nil || got.Value != tt.want {
			t.Errorf("patterns %q: lookup(%q) = %v, want %s", patterns, tt.value, got, tt.want)
		}
	}
}

// TestMatchManyWildcards: with 100,000 wildcard values, a request that
// matches none falls to the value-less node and one that matches gets the
// first in file order; matching still does not allocate.
func TestMatchManyWildcards(t *testing.T) {
	const n = 100000
	d := wildcardDomain(n)
	tests := []struct{ value, want string }{
		{"/svc99998/items", "path=/svc99998/*"},
		{"www.h99999.example.com", "path=*.h99999.example.com"},
		{"/svc4/a.h7.example.com", "path=/svc4/*"}, // both match: the first in the file
		{"/health", "path"},
	}
	for _, tt := range tests {
		entries := []Entry{{Key: "path", Value: tt.value}}
		if got := d.Match(entries); got == nil || got.Path != tt.want {
			t.Errorf("Match(path=%s) among %d wildcards = %v, want %s", tt.value, n, got, tt.want)
		}
		if allocs := testing.AllocsPerRun(10, func() { d.Match(entries) }); allocs != 0 {
			t.Errorf("Match(path=%s) among %d wildcards allocates %v times, want 0", tt.value, n, allocs)
		}
	}
}

// wildcardDomain has n wildcard values of key path, alternately a prefix
// ("/svc<i>/*") and a suffix ("*.h<i>.example.com") pattern, then a
// value-less path node: the tree Parse would make of such a file, made
// directly (parsing 100,000 lines is slow under the race detector).
func wildcardDomain(n int) *Domain {
	d := &Domain{Name: "w"}
	for i := range n {
		value := fmt.Sprintf("/svc%d/*", i)
		if i%2 == 1 {
			value = fmt.Sprintf("*.h%d.example.com", i)
		}
		d.Descriptors = append(d.Descriptors, &Descriptor{Key: "path", Value: value, Wildcard: true,
			Path: "path=" + value, segs: strings.Split(value, "*")})
	}
	d.Descriptors = append(d.Descriptors, &Descriptor{Key: "path", Path: "path"})
	d.index = newLevelIndex(d.Descriptors)
	return d
}

// BenchmarkMatchWildcards: the cost of a match does not grow with the
// number of wildcard values of the key.
func BenchmarkMatchWildcards(b *testing.B) {
	for _, n := range []int{10, 100000} {
		d := wildcardDomain(n)
		shapes := []struct{ name, value, want string }{
			{"match-prefix", fmt.Sprintf("/svc%d/items", n-2), fmt.Sprintf("path=/svc%d/*", n-2)},
			{"match-suffix", fmt.Sprintf("www.h%d.example.com", n-1), fmt.Sprintf("path=*.h%d.example.com", n-1)},
			{"miss", "/health", "path"},
		}
		for _, s := range shapes {
			entries := []Entry{{Key: "path", Value: s.value}}
			if got := d.Match(entries); got == nil || got.Path != s.want {
				b.Fatalf("wildcards=%d %s: Match = %v, want %s", n, s.name, got, s.want)
			}
			b.Run(fmt.Sprintf("wildcards=%d/%s", n, s.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					d.Match(entries)
				}
			})
		}
	}
}
