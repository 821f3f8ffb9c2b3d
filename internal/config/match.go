package config

import "strings"

// Match returns the node that entries lead to, or nil when they lead
// nowhere. At each level the entry's key and value pick, in this order, the
// node with that exact value, the first node (in file order) whose wildcard
// value matches the value, or the value-less node of that key. Once a node
// is chosen the walk never backtracks, as in envoyproxy/ratelimit; a request
// with more entries than the tree is deep matches nothing. The node's
// Limits apply (none when it has none). Match does not allocate.
func (d *Domain) Match(entries []Entry) *Descriptor {
	if d == nil || len(entries) == 0 {
		return nil
	}
	ix := &d.index
	var node *Descriptor
	for _, e := range entries {
		if node = ix.lookup(e); node == nil {
			return nil
		}
		ix = &node.index
	}
	return node
}

// lookup picks the node of one level for e.
func (ix *levelIndex) lookup(e Entry) *Descriptor {
	if n := ix.exact[e]; n != nil {
		return n
	}
	if w := ix.wildcards[e.Key]; w != nil {
		if n := w.lookup(e.Value); n != nil {
			return n
		}
	}
	return ix.keyOnly[e.Key]
}

// newLevelIndex indexes the nodes of one level.
func newLevelIndex(nodes []*Descriptor) levelIndex {
	var ix levelIndex
	var wildcards map[string][]*Descriptor // by key, in file order
	for _, n := range nodes {
		switch {
		case n.Value == "":
			if ix.keyOnly == nil {
				ix.keyOnly = make(map[string]*Descriptor)
			}
			ix.keyOnly[n.Key] = n
		case n.Wildcard:
			if wildcards == nil {
				wildcards = make(map[string][]*Descriptor)
			}
			wildcards[n.Key] = append(wildcards[n.Key], n)
		default:
			if ix.exact == nil {
				ix.exact = make(map[Entry]*Descriptor)
			}
			ix.exact[Entry{Key: n.Key, Value: n.Value}] = n
		}
	}
	if wildcards != nil {
		ix.wildcards = make(map[string]*wildcardIndex, len(wildcards))
		for key, ns := range wildcards {
			ix.wildcards[key] = newWildcardIndex(ns)
		}
	}
	return ix
}

// matchWildcard reports whether s matches the pattern whose parts between
// '*'s are segs (at least two): each '*' matches any run of bytes, the
// parts must appear in order, the first at the start and the last at the
// end. Taking the leftmost occurrence of each middle part is enough.
func matchWildcard(segs []string, s string) bool {
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
