package config

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"

	"github.com/rlsproject/rls/internal/strictyaml"
)

// build parses the sources in order into one Config: all of them are
// parsed, and every problem of every file is returned.
func build(srcs []source, opts ParseOptions) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain)}
	var order []*Domain // load order: files, then documents
	var all ErrorList
	merged := make(map[*Domain]map[Entry]bool) // for mergeDomain
	for _, src := range srcs {
		if src.err != nil {
			msg := "cannot read: " + src.err.Error()
			var pe *fs.PathError
			var ce *capError
			switch {
			case errors.As(src.err, &ce):
				msg = ce.msg
			case errors.As(src.err, &pe):
				msg = "cannot read: " + pe.Err.Error() // the path is already in front
			}
			all = append(all, &Error{File: src.name, Line: 1, Column: 1, Msg: msg, Err: src.err})
			continue
		}
		domains, errs, warns, testFile := parseFile(src.name, src.data, &opts, !src.inDir)
		if testFile && src.inDir {
			c.skipped = append(c.skipped, src.name)
			continue
		}
		c.files = append(c.files, src.name)
		c.warnings = append(c.warnings, warns...)
		for _, d := range domains {
			if d.Name == "" {
				continue // reported
			}
			if first, dup := c.domains[d.Name]; dup && opts.MergeDomains {
				errs = append(errs, mergeDomain(first, d, merged)...)
				continue
			} else if dup {
				errs = append(errs, &Error{File: src.name, Line: d.nameLine, Column: d.nameCol,
					Msg: fmt.Sprintf("duplicate domain %q (first defined at %s:%d:%d)", d.Name, first.File, first.nameLine, first.nameCol)})
				continue
			}
			c.domains[d.Name] = d
			order = append(order, d)
		}
		all = append(all, strictyaml.SortErrors(errs)...)
	}
	if len(all) > 0 {
		return nil, all
	}
	for _, d := range order {
		c.names = append(c.names, d.Name)
		d.index = newLevel(d.Descriptors)
		for _, n := range d.Descriptors {
			c.finish(n)
		}
	}
	slices.Sort(c.names)
	return c, nil
}

// finish indexes n's children and numbers its limits, then its subtree's,
// in pre-order.
func (c *Config) finish(n *Descriptor) {
	for _, l := range n.Limits {
		l.Index = len(c.limits)
		c.limits = append(c.limits, l)
	}
	n.index = newLevel(n.Children)
	for _, child := range n.Children {
		c.finish(child)
	}
}

// Domain returns the domain called name, or nil.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.domains[name]
}

// Domains returns the domains sorted by name. The slice is new; the domains
// are shared and must not be modified.
func (c *Config) Domains() []*Domain {
	if c == nil {
		return nil
	}
	out := make([]*Domain, len(c.names))
	for i, name := range c.names {
		out[i] = c.domains[name]
	}
	return out
}

// Limits returns every limit of the config, numbered by Limit.Index: files
// in load order, documents in file order, each tree in pre-order (a node's
// limits before its children's). The slice is shared and must not be
// modified.
func (c *Config) Limits() []*Limit {
	if c == nil {
		return nil
	}
	return c.limits
}

// Files returns the files the config was loaded from, in load order. The
// slice is shared and must not be modified.
func (c *Config) Files() []string {
	if c == nil {
		return nil
	}
	return c.files
}

// Skipped returns the files found in a directory that the load passed
// over, in load order: test files of rls test (a first document with a
// top-level tests: and no descriptors:), which sit beside the limits they
// test. A file named itself is never skipped. The slice is shared and
// must not be modified.
func (c *Config) Skipped() []string {
	if c == nil {
		return nil
	}
	return c.skipped
}

// Warnings returns the keys that the load ignored under
// ParseOptions.TolerateKeys, each at its position; nil under rls's own
// rules. The slice is shared and must not be modified.
func (c *Config) Warnings() []*Error {
	if c == nil {
		return nil
	}
	return c.warnings
}
