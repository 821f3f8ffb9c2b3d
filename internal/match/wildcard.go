package match

import "strings"

// wildcards finds, among the wildcard values of one key at one level of a
// tree, the first in order that matches a value. Patterns are indexed by
// their literal prefix (the text before the first '*') in a radix tree;
// where more than linearGroup patterns share a prefix, they are indexed by
// their literal suffix (the text after the last '*') in a radix tree read
// from the end. A lookup walks the value once forward and, at each of its
// prefixes that some patterns have, tries those patterns or walks their
// suffix tree backward: its cost grows with the value's length and the
// number of pattern prefixes along it, not with the number of patterns.
// Patterns with the same prefix and suffix (that differ in their middle
// parts) are tried one by one in order. Built once, never modified: safe
// for concurrent use. Lookups do not allocate.
type wildcards[N any] struct {
	nodes    []N        // in order: a pattern's rank is its position
	segs     [][]string // per rank, the pattern split at '*'
	prefixes radixNode
}

// linearGroup is the most patterns of one prefix tried one by one; more
// get a suffix tree.
const linearGroup = 8

// radixNode is a node of a radix tree over bytes. In the prefix tree a
// node holds the patterns whose prefix ends there: their ranks, or their
// suffix tree. In a suffix tree labels are stored reversed and a node
// holds the ranks of the patterns whose suffix ends there.
type radixNode struct {
	label    string       // the edge into this node
	children []*radixNode // by label[0], ascending
	ranks    []int32      // ascending
	suffixes *radixNode   // prefix tree only, instead of ranks
}

// newWildcards indexes nodes, the wildcard nodes of one key in order.
func newWildcards[N any](nodes []N, keyValue func(N) (key, value string)) *wildcards[N] {
	w := &wildcards[N]{nodes: nodes, segs: make([][]string, len(nodes))}
	var crowded []*radixNode
	for rank, n := range nodes {
		_, value := keyValue(n)
		w.segs[rank] = strings.Split(value, "*")
		p := w.prefixes.insert(w.segs[rank][0])
		p.ranks = append(p.ranks, int32(rank))
		if len(p.ranks) == linearGroup+1 {
			crowded = append(crowded, p)
		}
	}
	for _, p := range crowded {
		p.suffixes = &radixNode{}
		for _, r := range p.ranks {
			segs := w.segs[r]
			s := p.suffixes.insert(reversed(segs[len(segs)-1]))
			s.ranks = append(s.ranks, r)
		}
		p.ranks = nil
	}
	return w
}

// lookup returns the first pattern in order that matches v.
func (w *wildcards[N]) lookup(v string) (node N, ok bool) {
	best := len(w.nodes)
	n, i := &w.prefixes, 0
	for {
		if n.suffixes != nil {
			best = w.bySuffix(n.suffixes, v, best)
		} else {
			best = w.first(n.ranks, v, best)
		}
		if i == len(v) {
			break
		}
		c := n.child(v[i])
		if c == nil || !strings.HasPrefix(v[i:], c.label) {
			break
		}
		n, i = c, i+len(c.label)
	}
	if best < len(w.nodes) {
		return w.nodes[best], true
	}
	return node, false
}

// first returns the lowest of ranks below best whose pattern matches v,
// else best.
func (w *wildcards[N]) first(ranks []int32, v string, best int) int {
	for _, r := range ranks {
		if int(r) >= best {
			break
		}
		if matchSegments(w.segs[r], v) {
			return int(r)
		}
	}
	return best
}

// bySuffix walks the suffix tree n along v from its end and returns the
// lowest rank below best of a pattern there that matches v, else best.
func (w *wildcards[N]) bySuffix(n *radixNode, v string, best int) int {
	j := len(v) // v[j:] is read
	for {
		best = w.first(n.ranks, v, best)
		if j == 0 {
			return best
		}
		c := n.child(v[j-1])
		if c == nil || !endsWithReversed(v[:j], c.label) {
			return best
		}
		n, j = c, j-len(c.label)
	}
}

// child returns n's child whose label starts with b, or nil.
func (n *radixNode) child(b byte) *radixNode {
	lo, hi := 0, len(n.children)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		switch c := n.children[mid]; {
		case c.label[0] == b:
			return c
		case c.label[0] < b:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return nil
}

// insert returns the node that key leads to from n, adding and splitting
// nodes as needed.
func (n *radixNode) insert(key string) *radixNode {
	for key != "" {
		c := n.child(key[0])
		if c == nil {
			c = &radixNode{label: key}
			i := 0
			for i < len(n.children) && n.children[i].label[0] < key[0] {
				i++
			}
			n.children = append(n.children[:i], append([]*radixNode{c}, n.children[i:]...)...)
			return c
		}
		common := 0
		for common < len(c.label) && common < len(key) && c.label[common] == key[common] {
			common++
		}
		if common < len(c.label) {
			mid := &radixNode{label: c.label[:common], children: []*radixNode{c}}
			c.label = c.label[common:]
			for i, sibling := range n.children {
				if sibling == c {
					n.children[i] = mid
				}
			}
			c = mid
		}
		n, key = c, key[common:]
	}
	return n
}

// endsWithReversed reports whether s ends with the reverse of r.
func endsWithReversed(s, r string) bool {
	if len(r) > len(s) {
		return false
	}
	for k := 0; k < len(r); k++ {
		if s[len(s)-1-k] != r[k] {
			return false
		}
	}
	return true
}

// reversed returns s with its bytes in reverse order.
func reversed(s string) string {
	b := make([]byte, len(s))
	for i := range len(s) {
		b[len(s)-1-i] = s[i]
	}
	return string(b)
}
