package config

// This file says why a descriptor matched what it matched, for tools
// (POST /debug/explain, rls test): Explain walks the tree as Match does,
// with Match's own lookup, and keeps what it saw. Match stays as it is: a
// request's hot path never pays for an explanation.

import "github.com/rlsproject/rls/internal/match"

// Stop says where matching a descriptor's entries ended.
type Stop uint8

// The ends of a match.
const (
	// Matched: every entry led to a node; Trace.Node is the last one.
	Matched Stop = iota
	// UnknownDomain: the config has no such domain.
	UnknownDomain
	// NoEntries: the descriptor has no entries.
	NoEntries
	// NoNodeForKey: no node at the level has the entry's key.
	NoNodeForKey
	// ValueNotMatched: nodes of the entry's key are at the level, but none
	// has its value, no wildcard matches it and none is value-less.
	ValueNotMatched
	// DeeperThanConfig: the node reached by the previous entries has no
	// children: the descriptor has more entries than the tree is deep there.
	DeeperThanConfig
)

var stopNames = [...]string{"matched", "unknown_domain", "no_entries", "no_node_for_key", "value_not_matched", "deeper_than_config"}

// String returns the stop's name in explanations ("no_node_for_key", ...).
func (s Stop) String() string {
	if int(s) < len(stopNames) {
		return stopNames[s]
	}
	return "unknown"
}

// Step is one level of a match: the entry, the node it picked and how.
type Step struct {
	Entry Entry
	Node  *Descriptor
	How   match.How
}

// MaxCandidates bounds Trace.Keys and Trace.Candidates.
const MaxCandidates = 20

// Trace is how a descriptor's entries walked a domain's tree.
type Trace struct {
	// Node is the node reached: what Match returns (nil unless Matched).
	Node *Descriptor
	// Steps are the levels matched, one per entry up to where it stopped.
	Steps []Step
	Stop  Stop
	// At is the index of the entry at which matching stopped (0 for
	// UnknownDomain and NoEntries; unused when Matched).
	At int
	// Parent is the node under which matching stopped (nil at the top
	// level, and when Matched).
	Parent *Descriptor
	// Keys are the keys of the nodes at the level where NoNodeForKey
	// stopped, in file order, at most MaxCandidates.
	Keys []string
	// Candidates are the nodes of the entry's key at the level where
	// ValueNotMatched stopped, in file order, at most MaxCandidates.
	Candidates []*Descriptor
	// More counts the keys or candidates left out past MaxCandidates.
	More int
}

// Explain matches entries as Match does and says how: the node each entry
// picked and why, or where and why matching stopped. Its Node is always
// Match's answer. It allocates; it is for tools, not for requests.
func (d *Domain) Explain(entries []Entry) Trace {
	var tr Trace
	switch {
	case d == nil:
		tr.Stop = UnknownDomain
		return tr
	case len(entries) == 0:
		tr.Stop = NoEntries
		return tr
	}
	ix, level := &d.index, d.Descriptors
	var parent *Descriptor
	for i, e := range entries {
		node, how, ok := ix.Lookup(e.Key, e.Value)
		if !ok {
			tr.At, tr.Parent = i, parent
			tr.stopAt(level, e, parent)
			return tr
		}
		tr.Steps = append(tr.Steps, Step{Entry: e, Node: node, How: how})
		ix, level, parent = &node.index, node.Children, node
	}
	tr.Node = parent
	return tr
}

// stopAt says why e found no node among level, the children of parent
// (the top level when parent is nil).
func (tr *Trace) stopAt(level []*Descriptor, e Entry, parent *Descriptor) {
	if parent != nil && len(level) == 0 {
		tr.Stop = DeeperThanConfig
		return
	}
	seen := make(map[string]bool)
	for _, n := range level {
		if n.Key == e.Key {
			if len(tr.Candidates) < MaxCandidates {
				tr.Candidates = append(tr.Candidates, n)
			} else {
				tr.More++
			}
		}
	}
	if len(tr.Candidates) > 0 {
		tr.Stop = ValueNotMatched
		return
	}
	tr.Stop, tr.More = NoNodeForKey, 0
	for _, n := range level {
		if seen[n.Key] {
			continue
		}
		seen[n.Key] = true
		if len(tr.Keys) < MaxCandidates {
			tr.Keys = append(tr.Keys, n.Key)
		} else {
			tr.More++
		}
	}
}
