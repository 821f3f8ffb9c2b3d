package config

import (
	"fmt"
	"testing"
)

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
		d.Descriptors = append(d.Descriptors, &Descriptor{Key: "path", Value: value, Wildcard: true, Path: "path=" + value})
	}
	d.Descriptors = append(d.Descriptors, &Descriptor{Key: "path", Path: "path"})
	d.index = newLevel(d.Descriptors)
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
