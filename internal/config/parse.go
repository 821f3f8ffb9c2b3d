package config

import (
	"fmt"
	"math"

	"gopkg.in/yaml.v3"

	"github.com/rlsproject/rls/internal/httpdesc"
	"github.com/rlsproject/rls/internal/match"
	"github.com/rlsproject/rls/internal/strictyaml"
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
	return build([]source{{name: filename, data: data}}, ParseOptions{})
}

// File is one config file's name (used in errors and in Domain.File) and
// contents, for ParseFiles.
type File struct {
	Name string
	Data []byte
}

// ParseFiles parses and validates files together, as LoadWith does the
// files it reads, with opts: one Config, every problem in one ErrorList.
func ParseFiles(opts ParseOptions, files ...File) (*Config, error) {
	srcs := make([]source, len(files))
	for i, f := range files {
		srcs[i] = source{name: f.Name, data: f.Data}
	}
	return build(srcs, opts)
}

// parseFile parses the documents of one file into domains, with every
// problem found and the warnings of keys tolerated by opts. Domains are
// returned even when they have problems, so that duplicates across files
// can still be reported. A file whose first document is a test file of rls
// test (isTestFile) is not parsed further: testFile is true, and when the
// file was named itself rather than found in a directory (named), that is
// its one problem.
func parseFile(name string, data []byte, opts *ParseOptions, named bool) (domains []*Domain, errs, warnings []*Error, testFile bool) {
	p := newParser(name, len(data), opts)
	first := true
	for root := range p.Documents(data) {
		if first && isTestFile(root) {
			if !named {
				return nil, nil, nil, true
			}
			p.Errorf(root, "a test file of rls test (a top-level tests: and no descriptors:), not a config: run it with rls test CONFIG %s", name)
			return nil, p.Errors(), nil, true
		}
		first = false
		if d := p.domain(root); d != nil {
			domains = append(domains, d)
		}
	}
	errs = p.Errors()
	if len(domains) == 0 && len(errs) == 0 {
		errs = append(errs, &Error{File: name, Line: 1, Column: 1,
			Msg: "no domain in file (want a mapping with domain: and descriptors:)"})
	}
	return domains, errs, p.Warnings(), false
}

// isTestFile reports whether a document is a test file of rls test rather
// than a domain: a mapping with a tests: key and neither descriptors: nor
// http_descriptors:, which no domain can be (tests: is not a domain's key).
// A document with descriptors: and tests: stays a domain, whose tests: is
// then an unknown key.
func isTestFile(root *yaml.Node) bool {
	if root.Kind != yaml.MappingNode {
		return false
	}
	var tests bool
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch root.Content[i].Value {
		case "tests":
			tests = true
		case "descriptors", "http_descriptors":
			return false
		}
	}
	return tests
}

// domain parses one document.
func (p *parser) domain(n *yaml.Node) *Domain {
	if n.Kind != yaml.MappingNode {
		p.Errorf(n, "a document must be a mapping with domain: and descriptors:, got %s", strictyaml.Describe(n))
		return nil
	}
	d := &Domain{File: p.File()}
	d.Line, d.Column = strictyaml.Pos(n)
	d.nameLine, d.nameCol = d.Line, d.Column
	var named bool
	var descriptors strictyaml.Field
	for _, f := range p.Fields(n) {
		switch f.Key {
		case "domain":
			named = true
			d.nameLine, d.nameCol = strictyaml.Pos(f.Value)
			name, ok := p.String(f.Value, f.Key)
			if ok && name == "" {
				p.Errorf(f.Value, "domain is empty")
			}
			d.Name = name
		case "descriptors":
			descriptors = f
		case "http_descriptors":
			d.HTTPDescriptors = httpdesc.Parse(p.Reader, f)
		case "reservation_key":
			key, ok := p.String(f.Value, f.Key)
			if ok && key == "" {
				p.Errorf(f.Value, "reservation_key is empty (the key of the descriptor entry that carries a request's id, such as request_id)")
			}
			d.ReservationKey = key
		default:
			p.misplaced(f, levelDomain)
		}
	}
	if !named {
		p.Errorf(n, "domain is required")
	}
	p.reservationKey = d.ReservationKey
	if descriptors.Given() {
		d.Descriptors = p.descriptors(descriptors, nil, 0, true)
	}
	return d
}

// descriptors parses a descriptors list at depth (0 = top level) and checks
// that no two of its nodes have the same key and value. pathOK says whether
// the parent's path is complete enough to prefix messages with.
func (p *parser) descriptors(f strictyaml.Field, parent *Descriptor, depth int, pathOK bool) []*Descriptor {
	items := p.List(f.Value, f.Key)
	if p.nameOver {
		return nil // reported: the paths below would only add to it
	}
	if len(items) > 0 && depth >= MaxDepth {
		p.Errorf(items[0], "descriptors nested deeper than %d levels", MaxDepth)
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
				p.ErrorAt(item, fmt.Sprintf("duplicate descriptor %q (first at %d:%d)", d.Path, first.Line, first.Column))
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
		p.Errorf(n, "a descriptor must be a mapping with key:, got %s", strictyaml.Describe(n))
		return nil
	}
	d := &Descriptor{Parent: parent, Depth: depth}
	d.Line, d.Column = strictyaml.Pos(n)
	fields := p.Fields(n)
	if !p.identity(n, d, fields) {
		pathOK = false
	}

	outer := p.Context()
	if pathOK {
		p.SetContext(strictyaml.Context{What: "descriptor", Name: d.Path})
	}
	defer p.SetContext(outer)

	var rateLimit, rateLimits, children, share strictyaml.Field // absent unless given
	for _, f := range fields {
		switch f.Key {
		case "key", "value":
		case "descriptors":
			children = f
		case "rate_limit":
			rateLimit = f
		case "rate_limits":
			rateLimits = f
		case "shadow_mode":
			d.ShadowMode = p.Bool(f.Value, f.Key)
		case "count_denied_hits":
			d.CountDeniedHits = p.Bool(f.Value, f.Key)
		case "lease":
			d.Lease = p.Bool(f.Value, f.Key)
		case "reserve":
			d.Reserve, d.reserveAt = p.reserve(f), f.KeyNode
		case "quota_mode":
			d.QuotaMode = p.Bool(f.Value, f.Key)
		case "detailed_metric":
			d.DetailedMetric = p.Bool(f.Value, f.Key)
		case "value_to_metric":
			d.ValueToMetric = p.Bool(f.Value, f.Key)
		case "share_threshold":
			share = f
			d.ShareThreshold = p.Bool(f.Value, f.Key)
		case "metadata":
			d.Metadata = p.metadata(f)
		default:
			p.misplaced(f, levelDescriptor)
		}
	}
	if d.ShareThreshold && !d.Wildcard {
		p.Errorf(share.KeyNode, "share_threshold needs a value with a * wildcard, got value %q", d.Value)
	}
	if d.Key != "" && d.Key == p.reservationKey {
		p.Errorf(n, "key %q is the domain's reservation_key: that entry carries a request's id and is never matched against the descriptors", d.Key)
	}

	d.Shares = shares(d)
	d.Limits = p.limits(d, rateLimit, rateLimits)
	if children.Given() {
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
func (p *parser) identity(n *yaml.Node, d *Descriptor, fields []strictyaml.Field) bool {
	var keyNode *yaml.Node
	for _, f := range fields {
		switch f.Key {
		case "key":
			keyNode = f.Value
			d.Key, _ = p.String(f.Value, f.Key)
		case "value":
			d.Value, _ = p.String(f.Value, f.Key)
		}
	}
	d.Path = d.Key
	if d.Value != "" {
		d.Path += "=" + d.Value
	}
	if d.Parent != nil && p.spendNames(len(d.Parent.Path)+1+len(d.Path), n) {
		d.Path = d.Parent.Path + "/" + d.Path
	}
	d.Wildcard = match.IsWildcard(d.Value)
	if d.Key != "" {
		return true
	}
	if keyNode != nil {
		p.Errorf(keyNode, "descriptor has empty key")
	} else {
		p.Errorf(n, "descriptor has empty key")
	}
	return false
}

// metadata parses a descriptor's metadata into JSON-compatible values.
func (p *parser) metadata(f strictyaml.Field) map[string]any {
	v := p.Mapping(f.Value, f.Key)
	if v == nil {
		return nil
	}
	m, _ := p.jsonValue(v, 0).(map[string]any)
	return m
}

// jsonValue converts a YAML value into map[string]any, []any, string,
// float64, bool or nil.
func (p *parser) jsonValue(n *yaml.Node, depth int) any {
	n = p.Resolve(n)
	if depth > maxMetadataDepth {
		p.Errorf(n, "metadata nested deeper than %d levels", maxMetadataDepth)
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		fields := p.Fields(n)
		m := make(map[string]any, len(fields))
		for _, f := range fields {
			m[f.Key] = p.jsonValue(f.Value, depth+1)
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
				p.Errorf(n, "metadata value %s is not a finite number", n.Value)
				return nil
			}
			return x
		}
	}
	return n.Value
}
