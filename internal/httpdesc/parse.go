package httpdesc

import (
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/rlsproject/rls/internal/strictyaml"
)

// Item is one item of http_descriptors: it yields one descriptor whose
// entries come from its actions, in order. It belongs to an immutable
// config: never modified, safe for concurrent use.
type Item struct {
	actions []*action
	// Line and Column locate the item in its file.
	Line, Column int
}

// List is a domain's http_descriptors, in file order; nil has none.
type List []*Item

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

// parser reads http_descriptors with the reader of the file they are in.
type parser struct{ *strictyaml.Reader }

// Parse reads f, a domain's http_descriptors field, with r, the reader of
// its file: every problem is reported to r. The items returned are those
// with at least one valid action.
func Parse(r *strictyaml.Reader, f strictyaml.Field) List {
	p := parser{r}
	var out List
	for _, item := range p.List(f.Value, f.Key) {
		if item.Kind != yaml.MappingNode {
			p.Errorf(item, "each http_descriptors item must be a mapping like {actions: [...]}, got %s", strictyaml.Describe(item))
			continue
		}
		h := &Item{}
		h.Line, h.Column = strictyaml.Pos(item)
		given := 0 // actions written, valid or not
		for _, af := range p.Fields(item) {
			if af.Key != "actions" {
				p.Unknown(af, "http_descriptors item", []string{"actions"})
				continue
			}
			nodes := p.List(af.Value, af.Key)
			given += len(nodes)
			for _, n := range nodes {
				if a := p.action(n); a != nil {
					h.actions = append(h.actions, a)
				}
			}
		}
		if given == 0 {
			p.Errorf(item, "http_descriptors item has no actions")
		}
		if len(h.actions) > 0 {
			out = append(out, h)
		}
	}
	return out
}

// action parses one action: a mapping with exactly one action key, whose
// value holds the action's fields.
func (p parser) action(n *yaml.Node) *action {
	f, kind, ok := p.actionKind(n)
	if !ok {
		return nil
	}
	body, ok := p.actionBody(f)
	if !ok {
		return nil
	}
	a := &action{Kind: kind, DescriptorKey: defaultKeys[kind], ExpectMatch: true, V4PrefixLen: 32, V6PrefixLen: 128}
	a.Line, a.Column = strictyaml.Pos(f.KeyNode)
	for _, bf := range body {
		if !slices.Contains(actionKeys[kind], bf.Key) {
			p.Unknown(bf, f.Key, actionKeys[kind])
			continue
		}
		p.actionField(a, f.Key, bf)
	}
	for _, key := range requiredKeys[kind] {
		if !slices.ContainsFunc(body, func(bf strictyaml.Field) bool { return bf.Key == key }) {
			p.Errorf(f.KeyNode, "%s needs %s", f.Key, key)
		}
	}
	return a
}

// actionKind reads which action n is: its only key.
func (p parser) actionKind(n *yaml.Node) (strictyaml.Field, actionKind, bool) {
	if n.Kind != yaml.MappingNode {
		p.Errorf(n, "an action must be a mapping with one of %s, got %s", actionList, strictyaml.Describe(n))
		return strictyaml.Field{}, 0, false
	}
	fields := p.Fields(n)
	switch {
	case len(fields) == 0:
		p.Errorf(n, "an action must have one of %s", actionList)
		return strictyaml.Field{}, 0, false
	case len(fields) > 1:
		p.Errorf(fields[1].KeyNode, "an action has exactly one kind, got %q and %q (give each its own list item)", fields[0].Key, fields[1].Key)
		return strictyaml.Field{}, 0, false
	}
	f := fields[0]
	if k := slices.Index(actionNames[:], f.Key); k >= 0 {
		return f, actionKind(k), true
	}
	p.Errorf(f.KeyNode, "unsupported action %q (supported: %s)", f.Key, actionList)
	return strictyaml.Field{}, 0, false
}

// actionBody returns the fields of an action's value; null has none.
func (p parser) actionBody(f strictyaml.Field) ([]strictyaml.Field, bool) {
	body := p.Resolve(f.Value)
	switch {
	case strictyaml.IsNull(body):
		return nil, true
	case body.Kind != yaml.MappingNode:
		p.Errorf(body, "%s must be a mapping, got %s", f.Key, strictyaml.Describe(body))
		return nil, false
	}
	return p.Fields(body), true
}

// actionField reads one field of the action called name into a; the key is
// one that a's kind takes.
func (p parser) actionField(a *action, name string, bf strictyaml.Field) {
	switch bf.Key {
	case "descriptor_key":
		if a.DescriptorKey, _ = p.String(bf.Value, bf.Key); a.DescriptorKey == "" {
			p.Errorf(bf.Value, "%s: descriptor_key must not be empty", name)
			a.DescriptorKey = defaultKeys[a.Kind]
		}
	case "descriptor_value":
		if a.DescriptorValue, _ = p.String(bf.Value, bf.Key); a.DescriptorValue == "" {
			p.Errorf(bf.Value, "%s: descriptor_value must not be empty", name)
		}
	case "header_name":
		a.HeaderName = p.headerName(bf)
	case "query_parameter_name":
		if a.QueryParameterName, _ = p.String(bf.Value, bf.Key); a.QueryParameterName == "" {
			p.Errorf(bf.Value, "%s: query_parameter_name must not be empty", name)
		}
	case "skip_if_absent":
		a.SkipIfAbsent = p.Bool(bf.Value, bf.Key)
	case "v4_prefix_mask_len":
		a.V4PrefixLen = p.maskLen(bf, 32)
	case "v6_prefix_mask_len":
		a.V6PrefixLen = p.maskLen(bf, 128)
	case "expect_match":
		if !strictyaml.IsNull(p.Resolve(bf.Value)) {
			a.ExpectMatch = p.Bool(bf.Value, bf.Key)
		}
	case "headers":
		for _, hn := range p.List(bf.Value, bf.Key) {
			if m := p.headerMatcher(hn); m != nil {
				a.Headers = append(a.Headers, m)
			}
		}
		if len(a.Headers) == 0 {
			p.Errorf(bf.Value, "header_value_match: headers must not be empty")
		}
	}
}

// maskLen reads a prefix length in [0, bits]; null is bits.
func (p parser) maskLen(f strictyaml.Field, bits int) int {
	if strictyaml.IsNull(p.Resolve(f.Value)) {
		return bits
	}
	x, _ := p.Number(f.Value, f.Key, uint64(bits))
	return int(x)
}

// headerName reads a header name and lower-cases it. Pseudo-headers
// (":path") are allowed; other colons, spaces and control bytes are not.
func (p parser) headerName(f strictyaml.Field) string {
	name, ok := p.String(f.Value, f.Key)
	if !ok {
		return ""
	}
	if name == "" {
		p.Errorf(f.Value, "%s must not be empty", f.Key)
		return ""
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c == 0x7f || (c == ':' && i > 0) {
			p.Errorf(f.Value, "%s %q is not a valid header name", f.Key, name)
			return ""
		}
	}
	return strings.ToLower(name)
}

// headerMatcher parses one of header_value_match's headers.
func (p parser) headerMatcher(n *yaml.Node) *headerMatcher {
	if n.Kind != yaml.MappingNode {
		p.Errorf(n, "a header matcher must be a mapping like {name: ..., string_match: {...}}, got %s", strictyaml.Describe(n))
		return nil
	}
	m := &headerMatcher{}
	var kindF strictyaml.Field // absent until one is found
	var named, legacy bool
	for _, f := range p.Fields(n) {
		switch f.Key {
		case "name":
			named = true
			m.Name = p.headerName(f)
		case "string_match", "present_match":
			if kindF.Given() {
				p.Errorf(f.KeyNode, "a header matcher takes one of string_match and present_match, got both")
				continue
			}
			kindF = f
			if f.Key == "present_match" {
				m.Kind, m.Present = matchPresent, p.Bool(f.Value, f.Key)
			} else {
				p.stringMatch(f, m)
			}
		case "invert_match":
			m.Invert = p.Bool(f.Value, f.Key)
		default:
			if instead, ok := legacyMatchers[f.Key]; ok {
				p.Errorf(f.KeyNode, "%s is not supported; write %s", f.Key, instead)
				legacy = true
				continue
			}
			p.Unknown(f, "header matcher", []string{"name", "string_match", "present_match", "invert_match"})
		}
	}
	if !named {
		p.Errorf(n, "a header matcher needs name")
	}
	if !kindF.Given() && !legacy {
		p.Errorf(n, "a header matcher needs string_match or present_match")
	}
	return m
}

// stringMatch parses a string_match into m.
func (p parser) stringMatch(f strictyaml.Field, m *headerMatcher) {
	v := p.Mapping(f.Value, f.Key)
	if v == nil {
		if strictyaml.IsNull(p.Resolve(f.Value)) {
			p.Errorf(f.Value, "string_match needs one of exact, prefix, suffix, contains, safe_regex")
		}
		return
	}
	var kindF, ignoreF strictyaml.Field // absent until found
	for _, sf := range p.Fields(v) {
		switch sf.Key {
		case "exact", "prefix", "suffix", "contains", "safe_regex":
			if kindF.Given() {
				p.Errorf(sf.KeyNode, "string_match takes one of exact, prefix, suffix, contains, safe_regex, got %s and %s", kindF.Key, sf.Key)
				continue
			}
			kindF = sf
			if sf.Key == "safe_regex" {
				m.Kind = matchRegex
				p.safeRegex(sf, m)
				continue
			}
			switch sf.Key {
			case "exact":
				m.Kind = matchExact
			case "prefix":
				m.Kind = matchPrefix
			case "suffix":
				m.Kind = matchSuffix
			default:
				m.Kind = matchContains
			}
			m.Pattern, _ = p.String(sf.Value, sf.Key)
			if m.Pattern == "" && sf.Key != "exact" {
				p.Errorf(sf.Value, "string_match %s must not be empty", sf.Key)
			}
		case "ignore_case":
			ignoreF = sf
			m.IgnoreCase = p.Bool(sf.Value, sf.Key)
		default:
			p.Unknown(sf, "string_match", []string{"exact", "prefix", "suffix", "contains", "safe_regex", "ignore_case"})
		}
	}
	if !kindF.Given() {
		p.Errorf(v, "string_match needs one of exact, prefix, suffix, contains, safe_regex")
	} else if m.Kind == matchRegex && m.IgnoreCase {
		p.Errorf(ignoreF.KeyNode, "ignore_case does not apply to safe_regex (start the regex with (?i))")
	}
}

// safeRegex compiles safe_regex: {regex: ...}, anchored: the whole value
// must match, as in Envoy.
func (p parser) safeRegex(f strictyaml.Field, m *headerMatcher) {
	v := p.Mapping(f.Value, f.Key)
	if v == nil {
		if strictyaml.IsNull(p.Resolve(f.Value)) {
			p.Errorf(f.Value, "safe_regex needs regex")
		}
		return
	}
	var seen bool
	for _, rf := range p.Fields(v) {
		if rf.Key != "regex" {
			p.Unknown(rf, "safe_regex", []string{"regex"})
			continue
		}
		seen = true
		src, ok := p.String(rf.Value, rf.Key)
		if !ok {
			continue
		}
		if src == "" {
			p.Errorf(rf.Value, "safe_regex regex must not be empty")
			continue
		}
		if _, err := regexp.Compile(src); err != nil {
			p.Errorf(rf.Value, "safe_regex %q: %v", src, err)
			continue
		}
		re, err := regexp.Compile(`^(?:` + src + `)$`)
		if err != nil {
			p.Errorf(rf.Value, "safe_regex %q: %v", src, err)
			continue
		}
		m.Regex, m.regexSrc = re, src
	}
	if !seen {
		p.Errorf(v, "safe_regex needs regex")
	}
}
