package match

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// level is the level the Lookup tests search: exact values, wildcards in
// file order, value-less keys, and keys joined with '_' that
// envoyproxy/ratelimit would confuse.
var level = []*node{
	{"path", "/api/users"},
	{"path", "/api/*"},
	{"path", "/api/users*"},
	{"path", "*/action"},
	{"path", ""},
	{"a", "b_c"},
	{"a_b", "c"},
	{"any", "*"},
	{"path", "/api/users"}, // a duplicate: the first is found
	{"solo", ""},
}

func TestLookup(t *testing.T) {
	l := NewLevel(level, keyValue)
	tests := []struct {
		key, value string
		want       *node // nil: no node
		how        How
	}{
		{"path", "/api/users", level[0], Exact},
		{"path", "/api/orders", level[1], Wildcard},
		{"path", "/api/users/7", level[1], Wildcard}, // wildcards in order
		{"path", "/shop/action", level[3], Wildcard},
		{"path", "/other", level[4], AnyValue},
		{"path", "", level[4], AnyValue},
		{"any", "", level[7], Wildcard},
		{"a", "b_c", level[5], Exact},
		{"a_b", "c", level[6], Exact},
		{"a", "b", nil, 0},
		{"path_/api/x", "z", nil, 0}, // a wildcard stays within the value
		{"solo", "x", level[9], AnyValue},
		{"nope", "x", nil, 0},
	}
	for _, tt := range tests {
		got, how, ok := l.Lookup(tt.key, tt.value)
		if got != tt.want || ok != (tt.want != nil) || how != tt.how {
			t.Errorf("Lookup(%q, %q) = %v, %s, %v; want %v, %s", tt.key, tt.value, got, how, ok, tt.want, tt.how)
		}
	}
	var zero Level[*node]
	if got, _, ok := zero.Lookup("path", "/"); ok || got != nil {
		t.Errorf("zero Level: Lookup = %v, %v; want nothing", got, ok)
	}
}

// TestLookupAgreesWithScan: on random levels and entries over a small
// alphabet, Lookup answers as the rule read literally: the first node of
// the key with the exact value, else the first wildcard that matches, else
// the first value-less node.
func TestLookupAgreesWithScan(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 3))
	scan := func(nodes []*node, key, value string) (*node, How) {
		for _, how := range []How{Exact, Wildcard, AnyValue} {
			for _, n := range nodes {
				if n.key != key {
					continue
				}
				switch {
				case how == Exact && n.value != "" && !IsWildcard(n.value) && n.value == value,
					how == Wildcard && IsWildcard(n.value) && globMatch(n.value, value),
					how == AnyValue && n.value == "":
					return n, how
				}
			}
		}
		return nil, 0
	}
	for round := range 300 {
		var nodes []*node
		for range rng.IntN(30) {
			nodes = append(nodes, &node{key: randomWord(rng, "kj", 1), value: randomWord(rng, "ab*", 5)})
		}
		l := NewLevel(nodes, keyValue)
		for range 100 {
			key, value := randomWord(rng, "kj", 1), randomWord(rng, "ab", 6)
			want, wantHow := scan(nodes, key, value)
			got, how, ok := l.Lookup(key, value)
			if got != want || ok != (want != nil) || how != wantHow {
				t.Fatalf("seed %d round %d: nodes %v: Lookup(%q, %q) = %v %s %v, want %v %s", seed, round, nodes, key, value, got, how, ok, want, wantHow)
			}
		}
	}
}

// TestLookupDoesNotAllocate: Lookup is on every request's path.
func TestLookupDoesNotAllocate(t *testing.T) {
	l := NewLevel(level, keyValue)
	many := manyWildcards(1000)
	for _, tc := range []struct {
		l          *Level[*node]
		key, value string
	}{
		{&l, "path", "/api/users"}, {&l, "path", "/api/x"}, {&l, "path", "/nothing"}, {&l, "nope", "x"},
		{&many, "path", "/svc998/items"}, {&many, "path", "www.h999.example.com"}, {&many, "path", "/health"},
	} {
		if n := testing.AllocsPerRun(100, func() { tc.l.Lookup(tc.key, tc.value) }); n != 0 {
			t.Errorf("Lookup(%q, %q) allocates %v times, want 0", tc.key, tc.value, n)
		}
	}
}

func TestHowStrings(t *testing.T) {
	for how, want := range map[How]string{Exact: "exact", Wildcard: "wildcard", AnyValue: "any_value", How(9): "unknown"} {
		if got := how.String(); got != want {
			t.Errorf("How(%d).String() = %q, want %q", how, got, want)
		}
	}
}

// FuzzLookup: Lookup never panics and agrees with a plain scan of the
// wildcard patterns in order.
func FuzzLookup(f *testing.F) {
	f.Add("/api/*/items/*", "*.json", "/api/v1/items/7")
	f.Add("a*b*c", "*", "abc")
	f.Add("x", "*x*", "")
	f.Fuzz(func(t *testing.T, p1, p2, v string) {
		if len(p1)+len(p2)+len(v) > 256 || strings.Count(p1+p2, "*") > 16 {
			return // globMatch, the slow reference, is exponential in stars
		}
		nodes := []*node{{"k", p1}, {"k", p2}}
		l := NewLevel(nodes, keyValue)
		got, how, ok := l.Lookup("k", v)
		var want *node
		switch {
		case p1 != "" && !IsWildcard(p1) && p1 == v:
			want = nodes[0]
		case p2 != "" && !IsWildcard(p2) && p2 == v && p2 != p1:
			want = nodes[1]
		default:
			for _, n := range nodes {
				if IsWildcard(n.value) && globMatch(n.value, v) {
					want = n
					break
				}
			}
			if want == nil && (p1 == "" || p2 == "") {
				want = nodes[0]
				if p1 != "" {
					want = nodes[1]
				}
			}
		}
		if got != want || ok != (want != nil) {
			t.Fatalf("patterns %q, %q: Lookup(%q) = %v %s %v, want %v", p1, p2, v, got, how, ok, want)
		}
	})
}
