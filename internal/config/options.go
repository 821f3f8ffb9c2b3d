package config

import "fmt"

// ParseOptions relax the grammar's strict rules for files written for
// another server. The zero value is rls's own rules.
type ParseOptions struct {
	// MergeDomains merges the descriptors (and http_descriptors) of a
	// domain defined in several files or documents into one domain; a
	// top-level descriptor defined twice is still an error. Without it a
	// domain defined twice is an error.
	MergeDomains bool
	// TolerateKeys are keys that, found at a level of a document that has
	// no such key (unit in a descriptor), are ignored with a warning
	// (Config.Warnings) instead of refused. Unknown keys are still errors.
	TolerateKeys []string
	// TolerateReason ends each of those warnings, in parentheses: why the
	// key may be ignored. Empty adds nothing.
	TolerateReason string
}

// mergeDomain adds the descriptors (and http_descriptors) of d, a later
// definition of the same domain, to first, and returns the problems: a
// top-level descriptor that both define. top holds the key and value of
// first's top-level descriptors (made on the first merge), so that many
// documents of one domain merge in linear time.
func mergeDomain(first, d *Domain, top map[*Domain]map[Entry]bool) []*Error {
	seen := top[first]
	if seen == nil {
		seen = make(map[Entry]bool, len(first.Descriptors)+len(d.Descriptors))
		for _, o := range first.Descriptors {
			seen[Entry{Key: o.Key, Value: o.Value}] = true
		}
		top[first] = seen
	}
	var errs []*Error
	for _, n := range d.Descriptors {
		if seen[Entry{Key: n.Key, Value: n.Value}] {
			errs = append(errs, &Error{File: d.File, Line: n.Line, Column: n.Column,
				Msg: fmt.Sprintf("duplicate descriptor %q in domain %q, which %s defines too (merged domains may not repeat a top-level descriptor)", n.Path, d.Name, first.File)})
			continue
		}
		seen[Entry{Key: n.Key, Value: n.Value}] = true
		first.Descriptors = append(first.Descriptors, n)
	}
	first.HTTPDescriptors = append(first.HTTPDescriptors, d.HTTPDescriptors...)
	return errs
}
