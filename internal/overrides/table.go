package overrides

import (
	"fmt"
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
	// entries are every override not expired, by ID, with what cfg makes
	// of it (active or not).
	entries map[string]*entry
	// expires is the earliest expiry of an entry (µs since the epoch), 0
	// when none expires.
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

// Len is the number of overrides in the table (active or not).
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.entries)
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

// child returns p's child whose label starts with b, or nil.
func (p *pnode) child(b byte) *pnode {
	i, ok := slices.BinarySearchFunc(p.kids, b, func(c *pnode, b byte) int { return int(c.label[0]) - int(b) })
	if !ok {
		return nil
	}
	return p.kids[i]
}

// insert returns the node of prefix below p, adding and splitting nodes.
func (p *pnode) insert(prefix string) *pnode {
	for prefix != "" {
		i, ok := slices.BinarySearchFunc(p.kids, prefix[0], func(c *pnode, b byte) int { return int(c.label[0]) - int(b) })
		if !ok {
			c := &pnode{label: prefix}
			p.kids = slices.Insert(p.kids, i, c)
			return c
		}
		c := p.kids[i]
		n := commonPrefix(c.label, prefix)
		if n < len(c.label) {
			mid := &pnode{label: c.label[:n], kids: []*pnode{c}}
			c.label = c.label[n:]
			p.kids[i] = mid
			c = mid
		}
		p, prefix = c, prefix[n:]
	}
	return p
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

// build makes the table of cfg from the overrides by ID, those expired at
// now left out, reusing what old made of the overrides it already had
// for the same config. prev is the table of the config before cfg (nil
// when cfg is old's).
func build(cfg *config.Config, overrides map[string]*Override, old *Table, prev *Table, now time.Time) *Table {
	t := &Table{cfg: cfg, prev: prev, entries: make(map[string]*entry, len(overrides))}
	if prev != nil {
		prev.prev = nil // only the last config's
	}
	for id, o := range overrides {
		if !o.ExpiresAt.IsZero() && !now.Before(o.ExpiresAt) {
			continue
		}
		var e *entry
		if old != nil {
			if oe := old.entries[id]; oe != nil && oe.o == o && oe.cfg == cfg {
				e = oe
			}
		}
		if e == nil {
			e = newEntry(cfg, o)
		}
		t.entries[id] = e
		if !o.ExpiresAt.IsZero() {
			if at := o.ExpiresAt.UnixMicro(); t.expires == 0 || at < t.expires {
				t.expires = at
			}
		}
		if len(e.limits) > 0 {
			t.index(e)
		}
	}
	return t
}

// index adds e to the table's index.
func (t *Table) index(e *entry) {
	if t.domains == nil {
		t.domains = make(map[string]*level)
	}
	lv := t.domains[e.o.Domain]
	if lv == nil {
		lv = &level{}
		t.domains[e.o.Domain] = lv
	}
	for _, en := range e.o.Descriptor {
		if prefix, ok := isPrefix(en.Value); ok {
			if lv.prefix == nil {
				lv.prefix = make(map[string]*pnode)
			}
			root := lv.prefix[en.Key]
			if root == nil {
				root = &pnode{}
				lv.prefix[en.Key] = root
			}
			p := root.insert(prefix)
			if p.at == nil {
				p.at = &level{}
			}
			lv = p.at
			continue
		}
		if lv.exact == nil {
			lv.exact = make(map[pair]*level)
		}
		k := pair{en.Key, en.Value}
		next := lv.exact[k]
		if next == nil {
			next = &level{}
			lv.exact[k] = next
		}
		lv = next
	}
	if e.o.Name == "" {
		lv.any = e
		return
	}
	if lv.named == nil {
		lv.named = make(map[string]*entry)
	}
	lv.named[e.o.Name] = e
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
