package config

import (
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// HTTPDescriptor is one item of http_descriptors: it yields one descriptor
// whose entries come from its actions, in order.
type HTTPDescriptor struct {
	actions      []*action
	Line, Column int
}

// actionKind is the kind of an http_descriptors action, named like Envoy's
// route rate-limit actions.
type actionKind uint8

// The supported actions.
const (
	actionRemoteAddress actionKind = iota
	actionMaskedRemoteAddress
	actionRequestHeaders
	actionQueryParameters
	actionGenericKey
	actionHeaderValueMatch
)

// action is one http_descriptors action. Which fields matter depends on Kind.
type action struct {
	Kind actionKind
	// DescriptorKey is the entry's key (defaults as in Envoy:
	// "remote_address", "masked_remote_address", "generic_key",
	// "header_match").
	DescriptorKey string
	// DescriptorValue is the entry's value for generic_key and
	// header_value_match.
	DescriptorValue string
	// HeaderName (request_headers) is lower-case; pseudo-headers
	// ":method", ":path", ":authority" are allowed.
	HeaderName string
	// QueryParameterName (query_parameters).
	QueryParameterName string
	// SkipIfAbsent leaves the entry out instead of dropping the descriptor.
	SkipIfAbsent bool
	// V4PrefixLen, V6PrefixLen (masked_remote_address): defaults 32 and 128.
	V4PrefixLen, V6PrefixLen int
	// ExpectMatch (header_value_match, default true) and Headers: the entry
	// is produced when all Headers match (or, with ExpectMatch false, when
	// not all match).
	ExpectMatch bool
	Headers     []*headerMatcher

	Line, Column int
}

// headerMatcher is Envoy's HeaderMatcher restricted to string_match,
// present_match and invert_match.
type headerMatcher struct {
	Name string // lower-case
	// Exactly one of the following is in use, by Kind.
	Kind       matchKind
	Pattern    string         // exact, prefix, suffix, contains
	Regex      *regexp.Regexp // safe_regex (RE2, anchored: the whole value must match)
	IgnoreCase bool
	Present    bool // present_match: true = header present, false = absent
	Invert     bool

	regexSrc string // the safe_regex as written, for the config dump
}

// matchKind selects what a headerMatcher tests.
type matchKind uint8

// The match kinds.
const (
	matchExact matchKind = iota
	matchPrefix
	matchSuffix
	matchContains
	matchRegex
	matchPresent
)

var actionNames = [...]string{
	actionRemoteAddress:       "remote_address",
	actionMaskedRemoteAddress: "masked_remote_address",
	actionRequestHeaders:      "request_headers",
	actionQueryParameters:     "query_parameters",
	actionGenericKey:          "generic_key",
	actionHeaderValueMatch:    "header_value_match",
}

// String returns the action's name in config files ("request_headers", ...).
func (k actionKind) String() string {
	if int(k) < len(actionNames) {
		return actionNames[k]
	}
	return "unknown"
}

var matchNames = [...]string{
	matchExact:    "exact",
	matchPrefix:   "prefix",
	matchSuffix:   "suffix",
	matchContains: "contains",
	matchRegex:    "safe_regex",
	matchPresent:  "present_match",
}

// String returns the matcher's name in config files ("exact", ...,
// "safe_regex", "present_match").
func (k matchKind) String() string {
	if int(k) < len(matchNames) {
		return matchNames[k]
	}
	return "unknown"
}

var (
	actionList = strings.Join(actionNames[:], "|")
	// actionKeys are the keys each action takes.
	actionKeys = [...][]string{
		actionRemoteAddress:       nil,
		actionMaskedRemoteAddress: {"v4_prefix_mask_len", "v6_prefix_mask_len"},
		actionRequestHeaders:      {"header_name", "descriptor_key", "skip_if_absent"},
		actionQueryParameters:     {"query_parameter_name", "descriptor_key", "skip_if_absent"},
		actionGenericKey:          {"descriptor_value", "descriptor_key"},
		actionHeaderValueMatch:    {"descriptor_value", "descriptor_key", "expect_match", "headers"},
	}
	// requiredKeys are the keys each action must have.
	requiredKeys = [...][]string{
		actionRequestHeaders:   {"header_name", "descriptor_key"},
		actionQueryParameters:  {"query_parameter_name", "descriptor_key"},
		actionGenericKey:       {"descriptor_value"},
		actionHeaderValueMatch: {"descriptor_value", "headers"},
	}
	// defaultKeys are the entry keys of actions whose descriptor_key is
	// optional or absent, as in Envoy.
	defaultKeys = [...]string{
		actionRemoteAddress:       "remote_address",
		actionMaskedRemoteAddress: "masked_remote_address",
		actionGenericKey:          "generic_key",
		actionHeaderValueMatch:    "header_match",
	}
	// legacyMatchers are Envoy's deprecated headerMatcher fields, with
	// what to write instead.
	legacyMatchers = map[string]string{
		"exact_match":      "string_match: {exact: ...}",
		"prefix_match":     "string_match: {prefix: ...}",
		"suffix_match":     "string_match: {suffix: ...}",
		"contains_match":   "string_match: {contains: ...}",
		"safe_regex_match": "string_match: {safe_regex: {regex: ...}}",
	}
)

// httpDescriptors parses a domain's http_descriptors.
func (p *parser) httpDescriptors(f field) []*HTTPDescriptor {
	var out []*HTTPDescriptor
	for _, item := range p.list(f) {
		if item.Kind != yaml.MappingNode {
			p.errorf(item, "each http_descriptors item must be a mapping like {actions: [...]}, got %s", describe(item))
			continue
		}
		h := &HTTPDescriptor{}
		h.Line, h.Column = at(item)
		given := 0 // actions written, valid or not
		for _, af := range p.fields(item) {
			if af.key != "actions" {
				p.unknown(af, "http_descriptors item", []string{"actions"})
				continue
			}
			nodes := p.list(af)
			given += len(nodes)
			for _, n := range nodes {
				if a := p.action(n); a != nil {
					h.actions = append(h.actions, a)
				}
			}
		}
		if given == 0 {
			p.errorf(item, "http_descriptors item has no actions")
		}
		if len(h.actions) > 0 {
			out = append(out, h)
		}
	}
	return out
}

// action parses one action: a mapping with exactly one action key, whose
// value holds the action's fields.
func (p *parser) action(n *yaml.Node) *action {
	f, kind, ok := p.actionKind(n)
	if !ok {
		return nil
	}
	body, ok := p.actionBody(f)
	if !ok {
		return nil
	}
	a := &action{Kind: kind, DescriptorKey: defaultKeys[kind], ExpectMatch: true, V4PrefixLen: 32, V6PrefixLen: 128}
	a.Line, a.Column = at(f.k)
	for _, bf := range body {
		if !slices.Contains(actionKeys[kind], bf.key) {
			p.unknown(bf, f.key, actionKeys[kind])
			continue
		}
		p.actionField(a, f.key, bf)
	}
	for _, key := range requiredKeys[kind] {
		if !slices.ContainsFunc(body, func(bf field) bool { return bf.key == key }) {
			p.errorf(f.k, "%s needs %s", f.key, key)
		}
	}
	return a
}

// actionKind reads which action n is: its only key.
func (p *parser) actionKind(n *yaml.Node) (field, actionKind, bool) {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "an action must be a mapping with one of %s, got %s", actionList, describe(n))
		return field{}, 0, false
	}
	fields := p.fields(n)
	switch {
	case len(fields) == 0:
		p.errorf(n, "an action must have one of %s", actionList)
		return field{}, 0, false
	case len(fields) > 1:
		p.errorf(fields[1].k, "an action has exactly one kind, got %q and %q (give each its own list item)", fields[0].key, fields[1].key)
		return field{}, 0, false
	}
	f := fields[0]
	if k := slices.Index(actionNames[:], f.key); k >= 0 {
		return f, actionKind(k), true
	}
	p.errorf(f.k, "unsupported action %q (supported: %s)", f.key, actionList)
	return field{}, 0, false
}

// actionBody returns the fields of an action's value; null has none.
func (p *parser) actionBody(f field) ([]field, bool) {
	body := p.resolve(f.v)
	switch {
	case isNull(body):
		return nil, true
	case body.Kind != yaml.MappingNode:
		p.errorf(body, "%s must be a mapping, got %s", f.key, describe(body))
		return nil, false
	}
	return p.fields(body), true
}

// actionField reads one field of the action called name into a; the key is
// one that a's kind takes.
func (p *parser) actionField(a *action, name string, bf field) {
	switch bf.key {
	case "descriptor_key":
		if a.DescriptorKey, _ = p.str(bf); a.DescriptorKey == "" {
			p.errorf(bf.v, "%s: descriptor_key must not be empty", name)
			a.DescriptorKey = defaultKeys[a.Kind]
		}
	case "descriptor_value":
		if a.DescriptorValue, _ = p.str(bf); a.DescriptorValue == "" {
			p.errorf(bf.v, "%s: descriptor_value must not be empty", name)
		}
	case "header_name":
		a.HeaderName = p.headerName(bf)
	case "query_parameter_name":
		if a.QueryParameterName, _ = p.str(bf); a.QueryParameterName == "" {
			p.errorf(bf.v, "%s: query_parameter_name must not be empty", name)
		}
	case "skip_if_absent":
		a.SkipIfAbsent = p.boolean(bf)
	case "v4_prefix_mask_len":
		a.V4PrefixLen = p.maskLen(bf, 32)
	case "v6_prefix_mask_len":
		a.V6PrefixLen = p.maskLen(bf, 128)
	case "expect_match":
		if !isNull(p.resolve(bf.v)) {
			a.ExpectMatch = p.boolean(bf)
		}
	case "headers":
		for _, hn := range p.list(bf) {
			if m := p.headerMatcher(hn); m != nil {
				a.Headers = append(a.Headers, m)
			}
		}
		if len(a.Headers) == 0 {
			p.errorf(bf.v, "header_value_match: headers must not be empty")
		}
	}
}

// maskLen reads a prefix length in [0, bits]; null is bits.
func (p *parser) maskLen(f field, bits int) int {
	if isNull(p.resolve(f.v)) {
		return bits
	}
	x, _ := p.number(f, uint64(bits))
	return int(x)
}

// headerName reads a header name and lower-cases it. Pseudo-headers
// (":path") are allowed; other colons, spaces and control bytes are not.
func (p *parser) headerName(f field) string {
	name, ok := p.str(f)
	if !ok {
		return ""
	}
	if name == "" {
		p.errorf(f.v, "%s must not be empty", f.key)
		return ""
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c == 0x7f || (c == ':' && i > 0) {
			p.errorf(f.v, "%s %q is not a valid header name", f.key, name)
			return ""
		}
	}
	return strings.ToLower(name)
}

// headerMatcher parses one of header_value_match's headers.
func (p *parser) headerMatcher(n *yaml.Node) *headerMatcher {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "a header matcher must be a mapping like {name: ..., string_match: {...}}, got %s", describe(n))
		return nil
	}
	m := &headerMatcher{}
	var kindF field // k is nil until one is found
	var named, legacy bool
	for _, f := range p.fields(n) {
		switch f.key {
		case "name":
			named = true
			m.Name = p.headerName(f)
		case "string_match", "present_match":
			if kindF.k != nil {
				p.errorf(f.k, "a header matcher takes one of string_match and present_match, got both")
				continue
			}
			kindF = f
			if f.key == "present_match" {
				m.Kind, m.Present = matchPresent, p.boolean(f)
			} else {
				p.stringMatch(f, m)
			}
		case "invert_match":
			m.Invert = p.boolean(f)
		default:
			if instead, ok := legacyMatchers[f.key]; ok {
				p.errorf(f.k, "%s is not supported; write %s", f.key, instead)
				legacy = true
				continue
			}
			p.unknown(f, "header matcher", []string{"name", "string_match", "present_match", "invert_match"})
		}
	}
	if !named {
		p.errorf(n, "a header matcher needs name")
	}
	if kindF.k == nil && !legacy {
		p.errorf(n, "a header matcher needs string_match or present_match")
	}
	return m
}

// stringMatch parses a string_match into m.
func (p *parser) stringMatch(f field, m *headerMatcher) {
	v := p.mapping(f)
	if v == nil {
		if isNull(p.resolve(f.v)) {
			p.errorf(f.v, "string_match needs one of exact, prefix, suffix, contains, safe_regex")
		}
		return
	}
	var kindF, ignoreF field // k is nil until found
	for _, sf := range p.fields(v) {
		switch sf.key {
		case "exact", "prefix", "suffix", "contains", "safe_regex":
			if kindF.k != nil {
				p.errorf(sf.k, "string_match takes one of exact, prefix, suffix, contains, safe_regex, got %s and %s", kindF.key, sf.key)
				continue
			}
			kindF = sf
			if sf.key == "safe_regex" {
				m.Kind = matchRegex
				p.safeRegex(sf, m)
				continue
			}
			switch sf.key {
			case "exact":
				m.Kind = matchExact
			case "prefix":
				m.Kind = matchPrefix
			case "suffix":
				m.Kind = matchSuffix
			default:
				m.Kind = matchContains
			}
			m.Pattern, _ = p.str(sf)
			if m.Pattern == "" && sf.key != "exact" {
				p.errorf(sf.v, "string_match %s must not be empty", sf.key)
			}
		case "ignore_case":
			ignoreF = sf
			m.IgnoreCase = p.boolean(sf)
		default:
			p.unknown(sf, "string_match", []string{"exact", "prefix", "suffix", "contains", "safe_regex", "ignore_case"})
		}
	}
	if kindF.k == nil {
		p.errorf(v, "string_match needs one of exact, prefix, suffix, contains, safe_regex")
	} else if m.Kind == matchRegex && m.IgnoreCase {
		p.errorf(ignoreF.k, "ignore_case does not apply to safe_regex (start the regex with (?i))")
	}
}

// safeRegex compiles safe_regex: {regex: ...}, anchored: the whole value
// must match, as in Envoy.
func (p *parser) safeRegex(f field, m *headerMatcher) {
	v := p.mapping(f)
	if v == nil {
		if isNull(p.resolve(f.v)) {
			p.errorf(f.v, "safe_regex needs regex")
		}
		return
	}
	var seen bool
	for _, rf := range p.fields(v) {
		if rf.key != "regex" {
			p.unknown(rf, "safe_regex", []string{"regex"})
			continue
		}
		seen = true
		src, ok := p.str(rf)
		if !ok {
			continue
		}
		if src == "" {
			p.errorf(rf.v, "safe_regex regex must not be empty")
			continue
		}
		if _, err := regexp.Compile(src); err != nil {
			p.errorf(rf.v, "safe_regex %q: %v", src, err)
			continue
		}
		re, err := regexp.Compile(`^(?:` + src + `)$`)
		if err != nil {
			p.errorf(rf.v, "safe_regex %q: %v", src, err)
			continue
		}
		m.Regex, m.regexSrc = re, src
	}
	if !seen {
		p.errorf(v, "safe_regex needs regex")
	}
}
