package match

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// node is a tree node as the tests index them.
type node struct{ key, value string }

func keyValue(n *node) (string, string) { return n.key, n.value }

// globMatch is a plain recursive reference for '*' patterns.
func globMatch(p, s string) bool {
	if p == "" {
		return s == ""
	}
	if p[0] == '*' {
		for i := 0; i <= len(s); i++ {
			if globMatch(p[1:], s[i:]) {
				return true
			}
		}
		return false
	}
	return s != "" && s[0] == p[0] && globMatch(p[1:], s[1:])
}

// randomWord is a word of up to maxLen bytes of alphabet.
func randomWord(rng *rand.Rand, alphabet string, maxLen int) string {
	b := make([]byte, rng.IntN(maxLen+1))
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// firstMatch is the reference answer of a wildcard lookup: a plain scan.
func firstMatch(nodes []*node, v string) *node {
	for _, n := range nodes {
		if globMatch(n.value, v) {
			return n
		}
	}
	return nil
}

// TestWildcardIndexAgreesWithFileOrder: on random patterns and values over
// a small alphabet (so that they collide often), the index picks exactly
// the first pattern in order that matches, as a plain scan does.
func TestWildcardIndexAgreesWithFileOrder(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 2))
	for round := range 300 {
		var nodes []*node
		seen := make(map[string]bool)
		for range 1 + rng.IntN(40) {
			p := randomWord(rng, "ab*", 7)
			if !strings.Contains(p, "*") {
				p += "*"
			}
			if seen[p] {
				continue
			}
			seen[p] = true
			nodes = append(nodes, &node{key: "k", value: p})
		}
		ix := newWildcards(nodes, keyValue)
		for range 100 {
			v := randomWord(rng, "ab", 9)
			want := firstMatch(nodes, v)
			got, ok := ix.lookup(v)
			if got != want || ok != (want != nil) {
				var patterns []string
				for _, n := range nodes {
					patterns = append(patterns, n.value)
				}
				t.Fatalf("seed %d round %d: patterns %q: lookup(%q) = %v, %v; want %v", seed, round, patterns, v, got, ok, want)
			}
		}
	}
}

// TestWildcardIndexShapes: prefixes and suffixes that nest, split radix
// edges and share both ends keep file order.
func TestWildcardIndexShapes(t *testing.T) {
	patterns := []string{"/api/users/*", "/api/*", "/api/*/x", "*.example.com", "/a*b*c", "/a*c", "/ap*", "*"}
	var nodes []*node
	for _, p := range patterns {
		nodes = append(nodes, &node{key: "k", value: p})
	}
	ix := newWildcards(nodes, keyValue)
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
		got, ok := ix.lookup(tt.value)
		if !ok || got.value != tt.want {
			t.Errorf("patterns %q: lookup(%q) = %v, want %s", patterns, tt.value, got, tt.want)
		}
	}
}

func TestMatchSegments(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"*", "", true},
		{"*", "anything", true},
		{"a*", "a", true},
		{"a*", "abc", true},
		{"a*", "ba", false},
		{"*a", "ba", true},
		{"*a", "ab", false},
		{"a*b*c", "abc", true},
		{"a*b*c", "a__b__c", true},
		{"a*b*c", "acb", false},
		{"a*b*c", "a__c__b", false},
		{"a**b", "ab", true},
		{"ab*ba", "aba", false},
		{"ab*ba", "abba", true},
		{"*x*", "x", true},
		{"*x*", "yyy", false},
		{"/api/*/action", "/api//action", true},
		{"/api/*/action", "/api/v1/action/", false},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
	}
	for _, tt := range tests {
		if got := matchSegments(strings.Split(tt.pattern, "*"), tt.value); got != tt.want {
			t.Errorf("matchSegments(%q, %q) = %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}

// manyWildcards has n wildcard values of key path, alternately a prefix
// ("/svc<i>/*") and a suffix ("*.h<i>.example.com") pattern, then a
// value-less path node.
func manyWildcards(n int) Level[*node] {
	var nodes []*node
	for i := range n {
		value := fmt.Sprintf("/svc%d/*", i)
		if i%2 == 1 {
			value = fmt.Sprintf("*.h%d.example.com", i)
		}
		nodes = append(nodes, &node{key: "path", value: value})
	}
	nodes = append(nodes, &node{key: "path"})
	return NewLevel(nodes, keyValue)
}

// BenchmarkLookupWildcards: the cost of a lookup does not grow with the
// number of wildcard values of the key.
func BenchmarkLookupWildcards(b *testing.B) {
	for _, n := range []int{10, 100000} {
		l := manyWildcards(n)
		shapes := []struct {
			name, value, want string
			how               How
		}{
			{"match-prefix", fmt.Sprintf("/svc%d/items", n-2), fmt.Sprintf("/svc%d/*", n-2), Wildcard},
			{"match-suffix", fmt.Sprintf("www.h%d.example.com", n-1), fmt.Sprintf("*.h%d.example.com", n-1), Wildcard},
			{"miss", "/health", "", AnyValue},
		}
		for _, s := range shapes {
			if got, how, ok := l.Lookup("path", s.value); !ok || got.value != s.want || how != s.how {
				b.Fatalf("wildcards=%d %s: Lookup = %v %s, want %s %s", n, s.name, got, how, s.want, s.how)
			}
			b.Run(fmt.Sprintf("wildcards=%d/%s", n, s.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					l.Lookup("path", s.value)
				}
			})
		}
	}
}
