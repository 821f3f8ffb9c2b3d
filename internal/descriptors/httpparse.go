package descriptors

import (
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

var actionNames = [...]string{
	ActionRemoteAddress:       "remote_address",
	ActionMaskedRemoteAddress: "masked_remote_address",
	ActionRequestHeaders:      "request_headers",
	ActionQueryParameters:     "query_parameters",
	ActionGenericKey:          "generic_key",
	ActionHeaderValueMatch:    "header_value_match",
}

// String returns the action's name in config files ("request_headers", ...).
func (k ActionKind) String() string {
	if int(k) < len(actionNames) {
		return actionNames[k]
	}
	return "unknown"
}

var matchNames = [...]string{
	MatchExact:    "exact",
	MatchPrefix:   "prefix",
	MatchSuffix:   "suffix",
	MatchContains: "contains",
	MatchRegex:    "safe_regex",
	MatchPresent:  "present_match",
}

// String returns the matcher's name in config files ("exact", ...,
// "safe_regex", "present_match").
func (k MatchKind) String() string {
	if int(k) < len(matchNames) {
		return matchNames[k]
	}
	return "unknown"
}

var (
	actionList = strings.Join(actionNames[:], "|")
	// actionKeys are the keys each action takes.
	actionKeys = [...][]string{
		ActionRemoteAddress:       nil,
		ActionMaskedRemoteAddress: {"v4_prefix_mask_len", "v6_prefix_mask_len"},
		ActionRequestHeaders:      {"header_name", "descriptor_key", "skip_if_absent"},
		ActionQueryParameters:     {"query_parameter_name", "descriptor_key", "skip_if_absent"},
		ActionGenericKey:          {"descriptor_value", "descriptor_key"},
		ActionHeaderValueMatch:    {"descriptor_value", "descriptor_key", "expect_match", "headers"},
	}
	// defaultKeys are the entry keys of actions whose descriptor_key is
	// optional or absent, as in Envoy.
	defaultKeys = [...]string{
		ActionRemoteAddress:       "remote_address",
		ActionMaskedRemoteAddress: "masked_remote_address",
		ActionGenericKey:          "generic_key",
		ActionHeaderValueMatch:    "header_match",
	}
	// legacyMatchers are Envoy's deprecated HeaderMatcher fields, with
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
					h.Actions = append(h.Actions, a)
				}
			}
		}
		if given == 0 {
			p.errorf(item, "http_descriptors item has no actions")
		}
		if len(h.Actions) > 0 {
			out = append(out, h)
		}
	}
	return out
}

// action parses one action: a mapping with exactly one action key.
func (p *parser) action(n *yaml.Node) *Action {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "an action must be a mapping with one of %s, got %s", actionList, describe(n))
		return nil
	}
	fields := p.fields(n)
	if len(fields) == 0 {
		p.errorf(n, "an action must have one of %s", actionList)
		return nil
	}
	if len(fields) > 1 {
		p.errorf(fields[1].k, "an action has exactly one kind, got %q and %q (give each its own list item)", fields[0].key, fields[1].key)
		return nil
	}
	f := fields[0]
	a := &Action{ExpectMatch: true, V4PrefixLen: 32, V6PrefixLen: 128}
	found := false
	for k, name := range actionNames {
		if name == f.key {
			a.Kind, found = ActionKind(k), true
		}
	}
	if !found {
		p.errorf(f.k, "unsupported action %q (supported: %s)", f.key, actionList)
		return nil
	}
	a.Line, a.Column = at(f.k)
	a.DescriptorKey = defaultKeys[a.Kind]

	body := p.resolve(f.v)
	var bodyFields []field
	switch {
	case isNull(body):
	case body.Kind != yaml.MappingNode:
		p.errorf(body, "%s must be a mapping, got %s", f.key, describe(body))
		return nil
	default:
		bodyFields = p.fields(body)
	}
	var keySeen, valueSeen, nameSeen, headersSeen bool
	for _, bf := range bodyFields {
		switch {
		case !slices.Contains(actionKeys[a.Kind], bf.key):
			p.unknown(bf, f.key, actionKeys[a.Kind])
		case bf.key == "descriptor_key":
			keySeen = true
			if a.DescriptorKey, _ = p.str(bf); a.DescriptorKey == "" {
				p.errorf(bf.v, "%s: descriptor_key must not be empty", f.key)
				a.DescriptorKey = defaultKeys[a.Kind]
			}
		case bf.key == "descriptor_value":
			valueSeen = true
			if a.DescriptorValue, _ = p.str(bf); a.DescriptorValue == "" {
				p.errorf(bf.v, "%s: descriptor_value must not be empty", f.key)
			}
		case bf.key == "header_name":
			nameSeen = true
			a.HeaderName = p.headerName(bf)
		case bf.key == "query_parameter_name":
			nameSeen = true
			if a.QueryParameterName, _ = p.str(bf); a.QueryParameterName == "" {
				p.errorf(bf.v, "%s: query_parameter_name must not be empty", f.key)
			}
		case bf.key == "skip_if_absent":
			a.SkipIfAbsent = p.boolean(bf)
		case bf.key == "v4_prefix_mask_len":
			x, _ := p.number(bf, 32)
			a.V4PrefixLen = int(x)
			if isNull(p.resolve(bf.v)) {
				a.V4PrefixLen = 32
			}
		case bf.key == "v6_prefix_mask_len":
			x, _ := p.number(bf, 128)
			a.V6PrefixLen = int(x)
			if isNull(p.resolve(bf.v)) {
				a.V6PrefixLen = 128
			}
		case bf.key == "expect_match":
			if isNull(p.resolve(bf.v)) {
				break
			}
			a.ExpectMatch = p.boolean(bf)
		case bf.key == "headers":
			headersSeen = true
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
	switch a.Kind {
	case ActionRequestHeaders:
		if !nameSeen {
			p.errorf(f.k, "request_headers needs header_name")
		}
		if !keySeen {
			p.errorf(f.k, "request_headers needs descriptor_key")
		}
	case ActionQueryParameters:
		if !nameSeen {
			p.errorf(f.k, "query_parameters needs query_parameter_name")
		}
		if !keySeen {
			p.errorf(f.k, "query_parameters needs descriptor_key")
		}
	case ActionGenericKey:
		if !valueSeen {
			p.errorf(f.k, "generic_key needs descriptor_value")
		}
	case ActionHeaderValueMatch:
		if !valueSeen {
			p.errorf(f.k, "header_value_match needs descriptor_value")
		}
		if !headersSeen {
			p.errorf(f.k, "header_value_match needs headers")
		}
	}
	return a
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
func (p *parser) headerMatcher(n *yaml.Node) *HeaderMatcher {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "a header matcher must be a mapping like {name: ..., string_match: {...}}, got %s", describe(n))
		return nil
	}
	m := &HeaderMatcher{}
	var kindF *field
	var named, legacy bool
	for _, f := range p.fields(n) {
		switch f.key {
		case "name":
			named = true
			m.Name = p.headerName(f)
		case "string_match", "present_match":
			if kindF != nil {
				p.errorf(f.k, "a header matcher takes one of string_match and present_match, got both")
				continue
			}
			kindF = &f
			if f.key == "present_match" {
				m.MatchKind, m.Present = MatchPresent, p.boolean(f)
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
	if kindF == nil && !legacy {
		p.errorf(n, "a header matcher needs string_match or present_match")
	}
	return m
}

// stringMatch parses a string_match into m.
func (p *parser) stringMatch(f field, m *HeaderMatcher) {
	v := p.mapping(f)
	if v == nil {
		if isNull(p.resolve(f.v)) {
			p.errorf(f.v, "string_match needs one of exact, prefix, suffix, contains, safe_regex")
		}
		return
	}
	var kindF, ignoreF *field
	for _, sf := range p.fields(v) {
		switch sf.key {
		case "exact", "prefix", "suffix", "contains", "safe_regex":
			if kindF != nil {
				p.errorf(sf.k, "string_match takes one of exact, prefix, suffix, contains, safe_regex, got %s and %s", kindF.key, sf.key)
				continue
			}
			kindF = &sf
			if sf.key == "safe_regex" {
				m.MatchKind = MatchRegex
				p.safeRegex(sf, m)
				continue
			}
			switch sf.key {
			case "exact":
				m.MatchKind = MatchExact
			case "prefix":
				m.MatchKind = MatchPrefix
			case "suffix":
				m.MatchKind = MatchSuffix
			default:
				m.MatchKind = MatchContains
			}
			m.Pattern, _ = p.str(sf)
			if m.Pattern == "" && sf.key != "exact" {
				p.errorf(sf.v, "string_match %s must not be empty", sf.key)
			}
		case "ignore_case":
			ignoreF = &sf
			m.IgnoreCase = p.boolean(sf)
		default:
			p.unknown(sf, "string_match", []string{"exact", "prefix", "suffix", "contains", "safe_regex", "ignore_case"})
		}
	}
	if kindF == nil {
		p.errorf(v, "string_match needs one of exact, prefix, suffix, contains, safe_regex")
	} else if m.MatchKind == MatchRegex && m.IgnoreCase {
		p.errorf(ignoreF.k, "ignore_case does not apply to safe_regex (start the regex with (?i))")
	}
}

// safeRegex compiles safe_regex: {regex: ...}, anchored: the whole value
// must match, as in Envoy.
func (p *parser) safeRegex(f field, m *HeaderMatcher) {
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
