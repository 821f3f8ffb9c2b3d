package config

import (
	"fmt"
)

// ReferenceOptions load config files as envoyproxy/ratelimit does where it
// differs from rls's strict rules. The zero value is rls's own rules.
type ReferenceOptions struct {
	// MergeDomains merges the descriptors of a domain defined in several
	// files (or documents) into one domain, as MERGE_DOMAIN_CONFIG=true
	// does; a top-level descriptor defined twice is still an error.
	MergeDomains bool
	// IgnoreReferenceKeys ignores, with a warning (Config.Warnings), a key of
	// envoyproxy/ratelimit's key set found where rls has no such key (unit in
	// a descriptor, name in a document): the reference checks its keys
	// without regard to their level and ignores those its structures do
	// not hold, so such files load there. Unknown keys are still errors.
	IgnoreReferenceKeys bool
}

// referenceKeys is envoyproxy/ratelimit's key set (validKeys), which it
// accepts at any level.
var referenceKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true, "unit": true,
	"requests_per_unit": true, "unlimited": true, "shadow_mode": true, "quota_mode": true, "name": true,
	"replaces": true, "detailed_metric": true, "value_to_metric": true, "share_threshold": true, "metadata": true,
	"unit_multiplier": true,
}

// ignoredReferenceKey records the warning for f, a reference key at a level
// lv where rls has no such key.
func (p *parser) ignoredReferenceKey(f field, lv level) {
	line, col := at(f.k)
	msg := fmt.Sprintf("key %q is ignored %s (envoyproxy/ratelimit ignores it there too)", f.key, levelWhere[lv])
	if p.in != nil {
		msg = fmt.Sprintf("descriptor %q: %s", p.in.Path, msg)
	}
	p.warnings = append(p.warnings, &Error{File: p.file, Line: line, Column: col, Msg: msg})
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

// Warnings returns the keys that the load ignored under
// ReferenceOptions.IgnoreReferenceKeys, each at its position; nil under
// rls's own rules. The slice is shared and must not be modified.
func (c *Config) Warnings() []*Error {
	if c == nil {
		return nil
	}
	return c.warnings
}
