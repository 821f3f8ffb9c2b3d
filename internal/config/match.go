package config

import "github.com/rlsproject/rls/internal/match"

// Match returns the node that entries lead to, or nil when they lead
// nowhere. At each level the entry's key and value pick, in this order, the
// node with that exact value, the first node (in file order) whose wildcard
// value matches the value, or the value-less node of that key
// (match.Level). Once a node is chosen the walk never backtracks, as in
// envoyproxy/ratelimit; a request with more entries than the tree is deep
// matches nothing. The node's Limits apply (none when it has none). Match
// does not allocate.
func (d *Domain) Match(entries []Entry) *Descriptor {
	if d == nil || len(entries) == 0 {
		return nil
	}
	ix := &d.index
	var node *Descriptor
	for _, e := range entries {
		var ok bool
		if node, _, ok = ix.Lookup(e.Key, e.Value); !ok {
			return nil
		}
		ix = &node.index
	}
	return node
}

// newLevel indexes nodes, one level of a tree, for Match.
func newLevel(nodes []*Descriptor) match.Level[*Descriptor] {
	return match.NewLevel(nodes, keyValue)
}

// keyValue is a node's key and value, what match.Level indexes.
func keyValue(n *Descriptor) (key, value string) { return n.Key, n.Value }

// Step returns the node that the entry e picks among the children of
// parent (among the domain's top-level nodes when parent is nil), as
// Match does at each level, or nil when none does.
func (d *Domain) Step(parent *Descriptor, e Entry) *Descriptor {
	ix := &d.index
	if parent != nil {
		ix = &parent.index
	}
	n, _, ok := ix.Lookup(e.Key, e.Value)
	if !ok {
		return nil
	}
	return n
}
