package overrides

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// Table is the overrides in force on one config: for each override, the
// limits of that config it applies to, as copies with its values (same
// counter identity, same label and index), indexed so that a decision
// finds the override of a limit without allocating, at a cost that grows
// with the descriptor's entries and the length of their values, not with
// the number of overrides. Built by a Keeper; immutable and safe for
// concurrent use. A nil *Table has no overrides.
//
// Which override applies to a limit of a request descriptor: among the
// overrides of its domain whose entries match the descriptor's whole list
// of entries (same keys in the same order; each value equal, or starting
// with a prefix), and that name that limit or no limit, the most specific
// one, compared entry by entry from the first: an exact value beats a
// prefix, a longer prefix beats a shorter one; at equal entries, one that
// names the limit beats one that names none.
type Table struct {
	cfg *config.Config
	// prev is the table of the config that was current before cfg, for
	// decisions that started on it (nil: none); its own prev is dropped.
	prev    *Table
	domains map[string]*level
	// expires is the earliest expiry of an override indexed (µs since the
	// epoch), 0 when none expires.
	expires int64
}

// entry is one override as one config sees it.
type entry struct {
	o   *Override
	cfg *config.Config
	// limits are the config's limits it applies to, as copies with its
	// values, in config order.
	limits []*config.Limit
	// why says, when it applies to no limit, why not; problems, the limits
	// it matches whose algorithm its values do not fit.
	why      string
	problems []string
}

// level is a node of a domain's index: the overrides whose descriptors
// start with the entries that lead to it.
type level struct {
	exact  map[pair]*level   // next entry: this key and value
	prefix map[string]*pnode // next entry: a prefix of this key's value
	// the overrides whose descriptors end here: by limit name, and the one
	// that names no limit
	named map[string]*entry
	any   *entry
}

type pair struct{ key, value string }

// pnode is a node of a radix tree over the prefixes of one key's values
// at one level: the prefix is the labels from the root down to it.
type pnode struct {
	label string
	kids  []*pnode // by label[0], ascending
	at    *level   // the overrides with this prefix here; nil when none
}

// Config is the config the table was built on.
func (t *Table) Config() *config.Config {
	if t == nil {
		return nil
	}
	return t.cfg
}

// Apply returns the limit that counts in place of l, a limit of the node
// that a descriptor of domain with entries matched in the table's config:
// l's copy with the values of the override in force on it, or l itself
// when none is. It does not allocate.
func (t *Table) Apply(domain string, entries []engine.Entry, l *config.Limit) *config.Limit {
	if t == nil || len(t.domains) == 0 {
		return l
	}
	if e := t.find(domain, entries, l); e != nil {
		return e.limitFor(l)
	}
	return l
}

// Find is Apply that also returns the override in force (nil when none).
func (t *Table) Find(domain string, entries []engine.Entry, l *config.Limit) (*config.Limit, *Override) {
	if t == nil || len(t.domains) == 0 {
		return l, nil
	}
	if e := t.find(domain, entries, l); e != nil {
		return e.limitFor(l), e.o
	}
	return l, nil
}

func (t *Table) find(domain string, entries []engine.Entry, l *config.Limit) *entry {
	root := t.domains[domain]
	if root == nil || l.Rule == nil {
		return nil
	}
	return root.find(entries, l)
}

// find returns the most specific override under lv for the rest of a
// descriptor's entries that applies to l, nil when none does.
func (lv *level) find(entries []engine.Entry, l *config.Limit) *entry {
	if len(entries) == 0 {
		if e := lv.named[l.Name]; e != nil && l.Name != "" && e.has(l) {
			return e
		}
		if e := lv.any; e != nil && e.has(l) {
			return e
		}
		return nil
	}
	e := &entries[0]
	if next := lv.exact[pair{e.Key, e.Value}]; next != nil {
		if found := next.find(entries[1:], l); found != nil {
			return found
		}
	}
	if root := lv.prefix[e.Key]; root != nil {
		return root.find(e.Value, entries[1:], l)
	}
	return nil
}

// find tries the prefixes below p along v (what is left of the value past
// p's prefix), the longest first, then p's own.
func (p *pnode) find(v string, rest []engine.Entry, l *config.Limit) *entry {
	if v != "" {
		if c := p.child(v[0]); c != nil && strings.HasPrefix(v, c.label) {
			if found := c.find(v[len(c.label):], rest, l); found != nil {
				return found
			}
		}
	}
	if p.at != nil {
		return p.at.find(rest, l)
	}
	return nil
}

// child returns p's child whose label starts with b, or nil. The binary
// search of the config's wildcard index (match's radixNode.child), written
// again: a generic one over both, with the label read through a function,
// cost each lookup of both some 40 ns more.
func (p *pnode) child(b byte) *pnode {
	lo, hi := 0, len(p.kids)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		switch c := p.kids[mid]; {
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

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// has reports whether e applies to l.
func (e *entry) has(l *config.Limit) bool { return e.limitFor(l) != nil }

// limitFor returns e's copy of l, nil when e does not apply to l.
func (e *entry) limitFor(l *config.Limit) *config.Limit {
	for _, c := range e.limits {
		if c.Index == l.Index && c.Descriptor == l.Descriptor {
			return c
		}
	}
	return nil
}

// newEntry makes what cfg makes of o: the limits it applies to, or why
// none, and the problems of the limits its values do not fit.
func newEntry(cfg *config.Config, o *Override) *entry {
	e := &entry{o: o, cfg: cfg}
	dom := cfg.Domain(o.Domain)
	if dom == nil {
		e.why = fmt.Sprintf("the loaded config has no domain %q", o.Domain)
		return e
	}
	nodes := reach(dom, o.Descriptor)
	var counted, named, burstable int
	for _, n := range nodes {
		for _, l := range n.Limits {
			if l.Rule == nil {
				continue // unlimited: nothing to count
			}
			counted++
			if o.Name != "" && l.Name != o.Name {
				continue
			}
			named++
			var burst engine.Opt[uint32]
			if l.Rule.HasBurst() {
				burst = o.Burst
				burstable++
			}
			r, errs := l.Rule.WithLimit(o.RequestsPerUnit, burst)
			if len(errs) > 0 {
				for _, err := range errs {
					e.problems = append(e.problems, fmt.Sprintf("limit %s (%s): %s", l.Label, l.Rule.Algorithm(), err.Msg))
				}
				continue
			}
			c := *l
			c.Rule = r
			e.limits = append(e.limits, &c)
		}
	}
	switch {
	case len(nodes) == 0:
		e.why = fmt.Sprintf("descriptor %s reaches no node of domain %q", entriesText(o.Descriptor), o.Domain)
	case counted == 0:
		e.why = fmt.Sprintf("descriptor %s reaches %s, which has no limit that counts", entriesText(o.Descriptor), paths(nodes))
	case named == 0:
		e.why = fmt.Sprintf("descriptor %s reaches %s, which has no limit named %q", entriesText(o.Descriptor), paths(nodes), o.Name)
	case o.Burst.Set && burstable == 0:
		e.problems = append(e.problems, fmt.Sprintf("burst: it is for token_bucket limits, and none of the limits it matches (%s) is one", labels(e.limits)))
	}
	return e
}

// reach returns the nodes of dom that a request descriptor whose entries
// match entries (a value ending in '*' covers every value with that
// prefix) may reach: for an exact value, the node Match picks at that
// level; for a prefix, every node of that key whose value some value with
// that prefix may match (an exact value with the prefix, a wildcard whose
// text before its first '*' agrees with it, the value-less node).
func reach(dom *config.Domain, entries []engine.Entry) []*config.Descriptor {
	var out []*config.Descriptor
	var walk func(parent *config.Descriptor, i int)
	walk = func(parent *config.Descriptor, i int) {
		if i == len(entries) {
			out = append(out, parent)
			return
		}
		e := entries[i]
		prefix, ok := isPrefix(e.Value)
		if !ok {
			if n := dom.Step(parent, e); n != nil {
				walk(n, i+1)
			}
			return
		}
		level := dom.Descriptors
		if parent != nil {
			level = parent.Children
		}
		for _, n := range level {
			if n.Key != e.Key {
				continue
			}
			switch {
			case n.Value == "":
			case n.Wildcard:
				head, _, _ := strings.Cut(n.Value, "*")
				if !strings.HasPrefix(head, prefix) && !strings.HasPrefix(prefix, head) {
					continue
				}
			case !strings.HasPrefix(n.Value, prefix):
				continue
			}
			walk(n, i+1)
		}
	}
	walk(nil, 0)
	return out
}

func entriesText(entries []engine.Entry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.Key + "=" + e.Value
	}
	return strings.Join(parts, ",")
}

func paths(nodes []*config.Descriptor) string {
	var ps []string
	for _, n := range nodes {
		ps = append(ps, n.Path)
	}
	if len(ps) > 3 {
		return strings.Join(ps[:3], ", ") + fmt.Sprintf(" and %d more", len(ps)-3)
	}
	return strings.Join(ps, ", ")
}

func labels(limits []*config.Limit) string {
	var ls []string
	for _, l := range limits {
		ls = append(ls, l.Label)
	}
	return strings.Join(ls, ", ")
}

// newEntries makes what cfg makes of the overrides by ID, those expired
// at now left out, reusing the entries of old made for cfg of the same
// overrides.
func newEntries(cfg *config.Config, overrides map[string]*Override, old map[string]*entry, now time.Time) map[string]*entry {
	out := make(map[string]*entry, len(overrides))
	for id, o := range overrides {
		if expired(o, now) {
			continue
		}
		if oe := old[id]; oe != nil && oe.o == o && oe.cfg == cfg {
			out[id] = oe
			continue
		}
		out[id] = newEntry(cfg, o)
	}
	return out
}

// expired reports whether o has expired at now.
func expired(o *Override, now time.Time) bool {
	return !o.ExpiresAt.IsZero() && !now.Before(o.ExpiresAt)
}

// earliest returns the earliest expiry of the entries (µs since the
// epoch), 0 when none expires.
func earliest(entries map[string]*entry) int64 {
	var at int64
	for _, e := range entries {
		if x := e.o.ExpiresAt; !x.IsZero() && (at == 0 || x.UnixMicro() < at) {
			at = x.UnixMicro()
		}
	}
	return at
}

// buildTable indexes the entries (of cfg) into a new table; prev is the
// table of the config before cfg (nil: none).
func buildTable(cfg *config.Config, entries map[string]*entry, prev *Table) *Table {
	t := &Table{cfg: cfg, prev: prev, expires: earliest(entries)}
	if prev != nil {
		prev.prev = nil // only the last config's
	}
	for _, e := range entries {
		t.place(e, false, false)
	}
	return t
}

// changed returns a table like t, which stays as it is, where the entry
// old (nil: none) is replaced by e (nil: removed), and whose earliest
// expiry is expires. Only the path of each in the index is copied: a
// change costs what an insertion into each map along it does, whatever
// the number of overrides.
func (t *Table) changed(old, e *entry, expires int64) *Table {
	nt := &Table{cfg: t.cfg, prev: t.prev, domains: t.domains, expires: expires}
	if old != nil {
		nt.place(old, true, true)
	}
	if e != nil {
		nt.place(e, false, true)
	}
	return nt
}

// place adds e to the table's index, or removes it (an entry that applies
// to no limit is not indexed). With persist, what it changes is copied
// first (maps, levels, radix nodes along the path), so that tables sharing
// the rest are unchanged; otherwise the table's own index is changed in
// place (a table being built).
func (t *Table) place(e *entry, remove, persist bool) {
	if len(e.limits) == 0 {
		return
	}
	own := func(lv *level) *level {
		switch {
		case lv == nil:
			return &level{}
		case persist:
			c := *lv
			return &c
		}
		return lv
	}
	if t.domains == nil || persist {
		t.domains = cloneMap(t.domains, persist)
	}
	lv := own(t.domains[e.o.Domain])
	t.domains[e.o.Domain] = lv
	for _, en := range e.o.Descriptor {
		if prefix, ok := isPrefix(en.Value); ok {
			lv.prefix = cloneMap(lv.prefix, persist)
			root, p := pathTo(lv.prefix[en.Key], prefix, persist)
			lv.prefix[en.Key] = root
			p.at = own(p.at)
			lv = p.at
			continue
		}
		lv.exact = cloneMap(lv.exact, persist)
		k := pair{en.Key, en.Value}
		next := own(lv.exact[k])
		lv.exact[k] = next
		lv = next
	}
	switch {
	case e.o.Name == "" && remove:
		lv.any = nil
	case e.o.Name == "":
		lv.any = e
	case remove:
		lv.named = cloneMap(lv.named, persist)
		delete(lv.named, e.o.Name)
	default:
		lv.named = cloneMap(lv.named, persist)
		lv.named[e.o.Name] = e
	}
}

// cloneMap returns m copied when persist (a new map for nil either way),
// else m itself.
func cloneMap[K comparable, V any](m map[K]V, persist bool) map[K]V {
	switch {
	case m == nil:
		return make(map[K]V)
	case persist:
		return maps.Clone(m)
	}
	return m
}

// pathTo returns the radix tree p (nil: an empty one) with a node for
// prefix, and that node; with persist, p is unchanged: the nodes along the
// path are copies.
func pathTo(p *pnode, prefix string, persist bool) (root, node *pnode) {
	own := func(n *pnode) *pnode {
		if persist {
			c := *n
			c.kids = slices.Clone(n.kids)
			return &c
		}
		return n
	}
	if p == nil {
		p = &pnode{}
	} else {
		p = own(p)
	}
	root, cur := p, p
	for prefix != "" {
		i, ok := slices.BinarySearchFunc(cur.kids, prefix[0], func(c *pnode, b byte) int { return int(c.label[0]) - int(b) })
		if !ok {
			c := &pnode{label: prefix}
			cur.kids = slices.Insert(cur.kids, i, c)
			return root, c
		}
		c := own(cur.kids[i])
		if n := commonPrefix(c.label, prefix); n < len(c.label) {
			// Split: a node of the common part above the child.
			c.label = c.label[n:]
			mid := &pnode{label: prefix[:n], kids: []*pnode{c}}
			cur.kids[i] = mid
			cur, prefix = mid, prefix[n:]
			continue
		}
		cur.kids[i] = c
		cur, prefix = c, prefix[len(c.label):]
	}
	return root, cur
}

// listed is e as GET /admin/overrides lists it.
func (e *entry) listed() Listed {
	l := Listed{JSON: e.o.ToJSON(), Active: len(e.limits) > 0, Limits: []string{}, Problems: e.problems}
	for _, c := range e.limits {
		l.Limits = append(l.Limits, c.Label)
	}
	if e.why != "" {
		l.Problems = append([]string{e.why}, l.Problems...)
	}
	return l
}
