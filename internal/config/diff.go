package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// LimitChange is one difference between the limits of two configs, as
// GET /debug/status tells a reload.
type LimitChange struct {
	Domain string `json:"domain"`
	// Path is the limit's descriptor node; Label names it (as in metrics).
	Path  string `json:"path"`
	Label string `json:"label"`
	// Change is added, removed or changed.
	Change string `json:"change"`
	// Detail says what changed: "requests_per_unit: 10 → 20; window: 1m
	// → 1h". Empty for an added or removed limit.
	Detail string `json:"detail,omitempty"`
}

// Diff returns what differs between the limits of old and new (either may
// be nil: no limits), in new's order then old's: a limit is the same
// limit in both when its domain, node path and counter identity (Limit.ID)
// are; it changed when anything its dump shows (/debug/config) differs but
// its place in the file.
func Diff(old, new *Config) []LimitChange {
	type at struct{ domain, path, id string }
	key := func(d *Domain, l *Limit) at { return at{d.Name, l.Descriptor.Path, l.ID()} }
	before := make(map[at]*Limit)
	eachLimit(old, func(d *Domain, l *Limit) { before[key(d, l)] = l })
	var out []LimitChange
	seen := make(map[at]bool)
	eachLimit(new, func(d *Domain, l *Limit) {
		k := key(d, l)
		seen[k] = true
		c := LimitChange{Domain: k.domain, Path: k.path, Label: l.Label}
		o, ok := before[k]
		switch {
		case !ok:
			c.Change = "added"
		default:
			d := limitDetail(o, l)
			if d == "" {
				return
			}
			c.Change, c.Detail = "changed", d
		}
		out = append(out, c)
	})
	eachLimit(old, func(d *Domain, l *Limit) {
		if k := key(d, l); !seen[k] {
			seen[k] = true
			out = append(out, LimitChange{Domain: k.domain, Path: k.path, Label: l.Label, Change: "removed"})
		}
	})
	return out
}

// eachLimit calls f with every limit of c (nil: none) and its domain, in
// the config's order.
func eachLimit(c *Config, f func(*Domain, *Limit)) {
	var walk func(d *Domain, nodes []*Descriptor)
	walk = func(d *Domain, nodes []*Descriptor) {
		for _, n := range nodes {
			for _, l := range n.Limits {
				f(d, l)
			}
			walk(d, n.Children)
		}
	}
	for _, d := range c.Domains() {
		walk(d, d.Descriptors)
	}
}

// limitDetail says which fields of the dump differ between a and b,
// "field: old → new" each, in field order; "" when none does.
func limitDetail(a, b *Limit) string {
	da, db := dumpLimit(a), dumpLimit(b)
	da.Index, da.Line, da.Column, db.Index, db.Line, db.Column = 0, 0, 0, 0, 0, 0
	if reflect.DeepEqual(da, db) { // most limits of a reload: no JSON made
		return ""
	}
	fa, fb := dumpFields(a), dumpFields(b)
	names := make([]string, 0, len(fa)+len(fb))
	for n := range fa {
		names = append(names, n)
	}
	for n := range fb {
		if _, ok := fa[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var parts []string
	for _, n := range names {
		va, vb := fa[n], fb[n]
		if va == vb {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %s → %s", n, orNone(va), orNone(vb)))
	}
	return strings.Join(parts, "; ")
}

// dumpFields is l's dump, field by field, as compact JSON, without its
// place in the files (index, line, column).
func dumpFields(l *Limit) map[string]string {
	b, _ := json.Marshal(dumpLimit(l)) // plain values: never fails
	var m map[string]json.RawMessage
	json.Unmarshal(b, &m)
	out := make(map[string]string, len(m))
	for k, v := range m {
		switch k {
		case "index", "line", "column":
			continue
		}
		out[k] = string(v)
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return strings.Trim(s, `"`)
}
