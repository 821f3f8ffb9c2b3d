// Package match finds the node that an entry (key, value) picks among the
// nodes of one level of a tree, in the order envoyproxy/ratelimit's
// grammar gives: the node with that exact value, else the first node in
// order whose wildcard value matches, else the key's value-less node. It is
// generic over the node type and knows nothing of what nodes hold (limits)
// nor of the files they come from (YAML). Lookups do not allocate.
package match

import "strings"

// How says how an entry picked its node.
type How uint8

// The ways an entry picks a node, in the order Lookup tries them.
const (
	Exact    How = iota // the node with the entry's value
	Wildcard            // the first node whose wildcard value matches
	AnyValue            // the value-less node of the key
)

var howNames = [...]string{"exact", "wildcard", "any_value"}

// String returns "exact", "wildcard" or "any_value".
func (h How) String() string {
	if int(h) < len(howNames) {
		return howNames[h]
	}
	return "unknown"
}

// IsWildcard reports whether value is a wildcard pattern: it holds '*',
// which matches any run of bytes (including none) within a value.
func IsWildcard(value string) bool { return strings.Contains(value, "*") }

// Level is the match index of one level of a tree: its nodes by key and
// value. Built once by NewLevel, never modified: safe for concurrent use.
// The zero value has no nodes and matches nothing.
type Level[N any] struct {
	exact     map[pair]N               // key + exact value
	wildcards map[string]*wildcards[N] // nodes with a wildcard value, by key
	keyOnly   map[string]N             // value-less nodes
}

// pair is a key and an exact value.
type pair struct{ key, value string }

// NewLevel indexes nodes, one level of a tree, in order; keyValue says a
// node's key and its value ("" for a value-less node, a wildcard pattern
// when IsWildcard). Nodes should differ in key and value; of two that do
// not, Lookup finds the first.
func NewLevel[N any](nodes []N, keyValue func(N) (key, value string)) Level[N] {
	var l Level[N]
	var wild map[string][]N // by key, in order
	for _, n := range nodes {
		key, value := keyValue(n)
		switch {
		case value == "":
			if l.keyOnly == nil {
				l.keyOnly = make(map[string]N)
			}
			if _, dup := l.keyOnly[key]; !dup {
				l.keyOnly[key] = n
			}
		case IsWildcard(value):
			if wild == nil {
				wild = make(map[string][]N)
			}
			wild[key] = append(wild[key], n)
		default:
			if l.exact == nil {
				l.exact = make(map[pair]N)
			}
			if _, dup := l.exact[pair{key, value}]; !dup {
				l.exact[pair{key, value}] = n
			}
		}
	}
	if wild != nil {
		l.wildcards = make(map[string]*wildcards[N], len(wild))
		for key, ns := range wild {
			l.wildcards[key] = newWildcards(ns, keyValue)
		}
	}
	return l
}

// Lookup returns the node that the entry (key, value) picks and how, or
// ok false when no node of the level does.
func (l *Level[N]) Lookup(key, value string) (node N, how How, ok bool) {
	if n, ok := l.exact[pair{key, value}]; ok {
		return n, Exact, true
	}
	if w := l.wildcards[key]; w != nil {
		if n, ok := w.lookup(value); ok {
			return n, Wildcard, true
		}
	}
	if n, ok := l.keyOnly[key]; ok {
		return n, AnyValue, true
	}
	return node, 0, false
}

// matchSegments reports whether s matches the pattern whose parts between
// '*'s are segs (at least two): each '*' matches any run of bytes, the
// parts must appear in order, the first at the start and the last at the
// end. Taking the leftmost occurrence of each middle part is enough.
func matchSegments(segs []string, s string) bool {
	first, last := segs[0], segs[len(segs)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, seg := range segs[1 : len(segs)-1] {
		i := strings.Index(s, seg)
		if i < 0 {
			return false
		}
		s = s[i+len(seg):]
	}
	return true
}
