package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"gopkg.in/yaml.v3"
)

// MaxDepth is the deepest descriptor tree a config may hold (levels of
// nested descriptors), and so the most entries a request descriptor needs:
// one with more entries matches nothing. It is the one definition of this
// bound; request validation and counter keys use it too.
const MaxDepth = 16

// maxMetadataDepth bounds the nesting of a metadata value.
const maxMetadataDepth = 64

// Parse parses and validates one config file: one or more YAML documents
// separated by ---, each one domain. filename is used in errors and in
// Domain.File only. Config problems are returned as an ErrorList holding all
// of them.
func Parse(filename string, data []byte) (*Config, error) {
	return build([]source{{name: filename, data: data}}, ReferenceOptions{})
}

// parseFile parses the documents of one file into domains, with every
// problem found. Domains are returned even when they have problems, so that
// duplicates across files can still be reported.
func parseFile(name string, data []byte, ref ReferenceOptions) ([]*Domain, []*Error, []*Error) {
	p := newParser(name, len(data))
	p.referenceKeys = ref.IgnoreReferenceKeys
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var domains []*Domain
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			p.syntaxError(err, data)
			break
		}
		if len(doc.Content) == 0 {
			continue
		}
		root := p.resolve(doc.Content[0])
		if isNull(root) {
			continue // an empty document, as after a trailing ---
		}
		if d := p.domain(root); d != nil {
			domains = append(domains, d)
		}
	}
	if len(domains) == 0 && len(p.errs) == 0 {
		p.errs = append(p.errs, &Error{File: name, Line: 1, Column: 1,
			Msg: "no domain in file (want a mapping with domain: and descriptors:)"})
	}
	return domains, p.errs, p.warnings
}

// domain parses one document.
func (p *parser) domain(n *yaml.Node) *Domain {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "a document must be a mapping with domain: and descriptors:, got %s", describe(n))
		return nil
	}
	d := &Domain{File: p.file}
	d.Line, d.Column = at(n)
	d.nameLine, d.nameCol = d.Line, d.Column
	var named bool
	var descriptors field
	for _, f := range p.fields(n) {
		switch f.key {
		case "domain":
			named = true
			d.nameLine, d.nameCol = at(f.v)
			name, ok := p.str(f)
			if ok && name == "" {
				p.errorf(f.v, "domain is empty")
			}
			d.Name = name
		case "descriptors":
			descriptors = f
		case "http_descriptors":
			d.HTTPDescriptors = p.httpDescriptors(f)
		default:
			p.misplaced(f, levelDomain)
		}
	}
	if !named {
		p.errorf(n, "domain is required")
	}
	if descriptors.k != nil {
		d.Descriptors = p.descriptors(descriptors, nil, 0, true)
	}
	return d
}

// descriptors parses a descriptors list at depth (0 = top level) and checks
// that no two of its nodes have the same key and value. pathOK says whether
// the parent's path is complete enough to prefix messages with.
func (p *parser) descriptors(f field, parent *Descriptor, depth int, pathOK bool) []*Descriptor {
	items := p.list(f)
	if p.nameOver {
		return nil // reported: the paths below would only add to it
	}
	if len(items) > 0 && depth >= MaxDepth {
		p.errorf(items[0], "descriptors nested deeper than %d levels", MaxDepth)
		return nil
	}
	var out []*Descriptor
	seen := make(map[Entry]*Descriptor, len(items))
	for _, item := range items {
		d := p.descriptor(item, parent, depth, pathOK)
		if d == nil {
			continue
		}
		if d.Key != "" {
			e := Entry{Key: d.Key, Value: d.Value}
			if first, dup := seen[e]; dup {
				p.errorAt(item, fmt.Sprintf("duplicate descriptor %q (first at %d:%d)", d.Path, first.Line, first.Column))
			} else {
				seen[e] = d
			}
		}
		out = append(out, d)
	}
	return out
}

// descriptor parses one descriptor node and its subtree: its key and
// value first (the path names the node in later messages), then its other
// fields, its limits and its children.
func (p *parser) descriptor(n *yaml.Node, parent *Descriptor, depth int, pathOK bool) *Descriptor {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "a descriptor must be a mapping with key:, got %s", describe(n))
		return nil
	}
	d := &Descriptor{Parent: parent, Depth: depth}
	d.Line, d.Column = at(n)
	fields := p.fields(n)
	if !p.identity(n, d, fields) {
		pathOK = false
	}

	outer := p.in
	if pathOK {
		p.in = d
	}
	defer func() { p.in = outer }()

	var rateLimit, rateLimits, children, share field // k is nil when absent
	for _, f := range fields {
		switch f.key {
		case "key", "value":
		case "descriptors":
			children = f
		case "rate_limit":
			rateLimit = f
		case "rate_limits":
			rateLimits = f
		case "shadow_mode":
			d.ShadowMode = p.boolean(f)
		case "count_denied_hits":
			d.CountDeniedHits = p.boolean(f)
		case "quota_mode":
			d.QuotaMode = p.boolean(f)
		case "detailed_metric":
			d.DetailedMetric = p.boolean(f)
		case "value_to_metric":
			d.ValueToMetric = p.boolean(f)
		case "share_threshold":
			share = f
			d.ShareThreshold = p.boolean(f)
		case "metadata":
			d.Metadata = p.metadata(f)
		default:
			p.misplaced(f, levelDescriptor)
		}
	}
	if d.ShareThreshold && !d.Wildcard {
		p.errorf(share.k, "share_threshold needs a value with a * wildcard, got value %q", d.Value)
	}
	d.Shares = shares(d)
	d.Limits = p.limits(d, rateLimit, rateLimits)
	if children.k != nil {
		d.Children = p.descriptors(children, d, depth+1, pathOK)
	}
	return d
}

// shares returns d's Shares from its parent's and its own share_threshold.
func shares(d *Descriptor) []string {
	var inherited []string
	if d.Parent != nil {
		inherited = d.Parent.Shares
	}
	if inherited == nil && !d.ShareThreshold {
		return nil
	}
	s := make([]string, d.Depth+1)
	copy(s, inherited)
	if d.ShareThreshold {
		s[d.Depth] = d.Value
	}
	return s
}

// identity reads the key and value of the descriptor n into d and sets its
// path; false when the key is missing or empty (reported).
func (p *parser) identity(n *yaml.Node, d *Descriptor, fields []field) bool {
	var keyNode *yaml.Node
	for _, f := range fields {
		switch f.key {
		case "key":
			keyNode = f.v
			d.Key, _ = p.str(f)
		case "value":
			d.Value, _ = p.str(f)
		}
	}
	d.Path = d.Key
	if d.Value != "" {
		d.Path += "=" + d.Value
	}
	if d.Parent != nil && p.spendNames(len(d.Parent.Path)+1+len(d.Path), n) {
		d.Path = d.Parent.Path + "/" + d.Path
	}
	if strings.Contains(d.Value, "*") {
		d.Wildcard = true
		d.segs = strings.Split(d.Value, "*")
	}
	if d.Key != "" {
		return true
	}
	if keyNode != nil {
		p.errorf(keyNode, "descriptor has empty key")
	} else {
		p.errorf(n, "descriptor has empty key")
	}
	return false
}

// metadata parses a descriptor's metadata into JSON-compatible values.
func (p *parser) metadata(f field) map[string]any {
	v := p.mapping(f)
	if v == nil {
		return nil
	}
	m, _ := p.jsonValue(v, 0).(map[string]any)
	return m
}

// jsonValue converts a YAML value into map[string]any, []any, string,
// float64, bool or nil.
func (p *parser) jsonValue(n *yaml.Node, depth int) any {
	n = p.resolve(n)
	if depth > maxMetadataDepth {
		p.errorf(n, "metadata nested deeper than %d levels", maxMetadataDepth)
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		fields := p.fields(n)
		m := make(map[string]any, len(fields))
		for _, f := range fields {
			m[f.key] = p.jsonValue(f.v, depth+1)
		}
		return m
	case yaml.SequenceNode:
		s := make([]any, len(n.Content))
		for i, item := range n.Content {
			s[i] = p.jsonValue(item, depth+1)
		}
		return s
	}
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return b
		}
	case "!!int", "!!float":
		var x float64
		if err := n.Decode(&x); err == nil {
			if math.IsInf(x, 0) || math.IsNaN(x) {
				p.errorf(n, "metadata value %s is not a finite number", n.Value)
				return nil
			}
			return x
		}
	}
	return n.Value
}
