package config

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Bounds on what one file may expand to. Aliases let a small file stand
// for a huge one (an alias cycle, a "billion laughs", one long text used a
// thousand times), and a node's path repeats its ancestors' keys and
// values: the parser counts both and gives up past these bounds, so that
// parsing, the Config and its dump stay in proportion to the file.
const (
	// maxAliasNodes bounds the YAML nodes brought in through aliases (each
	// use of an alias costs the size of the aliased node). Far above what a
	// hand-written config needs.
	maxAliasNodes = 100000
	// Aliases may bring in as many bytes of text as the file holds, plus
	// expansionSlack; descriptor paths and limit labels may add up to
	// nameRatio times the file's size, plus expansionSlack.
	expansionSlack = 1 << 20
	nameRatio      = 8
)

// parser walks the yaml.Node trees of one file and collects every problem
// with its position. It is used by one goroutine, for one file.
type parser struct {
	file string
	errs []*Error
	// in is the descriptor being parsed, whose path prefixes messages; nil
	// when its path is not known.
	in *Descriptor

	aliasNodes, aliasBytes  int                 // brought in through aliases
	maxAliasBytes           int                 // expansionSlack + the file's size
	aliasOver               bool                // past a bound: aliases resolve to null
	nameBytes, maxNameBytes int                 // descriptor paths and limit labels
	nameOver                bool                // past maxNameBytes: reported
	sizes                   map[*yaml.Node]size // memo of nodeSize
	// referenceKeys ignores, with a warning, keys that envoyproxy/ratelimit
	// accepts at any level (ReferenceOptions.IgnoreReferenceKeys).
	referenceKeys bool
	warnings      []*Error
	merging       map[*yaml.Node]bool // mappings whose merge keys are being expanded
}

// newParser returns a parser for the file called name holding size bytes.
func newParser(name string, size int) *parser {
	return &parser{file: name, maxAliasBytes: expansionSlack + size, maxNameBytes: expansionSlack + nameRatio*size}
}

// at returns the position of n: for a mapping, that of its first key.
func at(n *yaml.Node) (line, col int) {
	if n.Kind == yaml.MappingNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	if n.Line < 1 {
		return 1, 1
	}
	return n.Line, n.Column
}

// errorf records a problem at n, prefixed with the descriptor being
// parsed.
func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if p.in != nil {
		msg = fmt.Sprintf("descriptor %q: %s", p.in.Path, msg)
	}
	p.errorAt(n, msg)
}

// errorAt records msg at n without a context prefix.
func (p *parser) errorAt(n *yaml.Node, msg string) {
	line, col := at(n)
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Column: col, Msg: msg})
}

// resolve follows aliases. Past a bound on what aliases bring in it
// reports the problem once and answers a null node, so that cyclic
// documents end.
func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode {
		if n.Alias == nil || p.aliasOver {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
		}
		size := p.nodeSize(n.Alias)
		p.aliasNodes += size.nodes
		p.aliasBytes += size.bytes
		switch {
		case p.aliasNodes > maxAliasNodes:
			p.aliasOver = true
			p.errorAt(n, fmt.Sprintf("aliases expand to more than %d nodes (an alias cycle, or an exponential expansion)", maxAliasNodes))
		case p.aliasBytes > p.maxAliasBytes:
			p.aliasOver = true
			p.errorAt(n, fmt.Sprintf("aliases expand to more than %d bytes of text (the file's size plus 1 MiB): each use of an alias repeats its text", p.maxAliasBytes))
		}
		if p.aliasOver {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
		}
		n = n.Alias
	}
	return n
}

// size is what a YAML tree holds: its nodes and the bytes of its scalars.
type size struct{ nodes, bytes int }

// nodeSize measures n's tree, an alias in it counting as one node.
func (p *parser) nodeSize(n *yaml.Node) size {
	if s, ok := p.sizes[n]; ok {
		return s
	}
	if p.sizes == nil {
		p.sizes = make(map[*yaml.Node]size)
	}
	p.sizes[n] = size{nodes: 1} // a node that contains itself counts once
	s := size{nodes: 1, bytes: len(n.Value)}
	if n.Kind != yaml.AliasNode {
		for _, c := range n.Content {
			cs := p.nodeSize(c)
			s.nodes += cs.nodes
			s.bytes += cs.bytes
		}
	}
	p.sizes[n] = s
	return s
}

// spendNames counts n more bytes of descriptor paths and limit labels and
// reports whether they fit; the first time they do not, the problem is
// reported at at.
func (p *parser) spendNames(n int, at *yaml.Node) bool {
	if p.nameOver {
		return false
	}
	p.nameBytes += n
	if p.nameBytes <= p.maxNameBytes {
		return true
	}
	p.nameOver = true
	p.errorAt(at, fmt.Sprintf("descriptor paths and limit labels add up to more than %d bytes (8 times the file's size plus 1 MiB): "+
		"a long key or value is repeated in the path of every descriptor below it", p.maxNameBytes))
	return false
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names the YAML type and value of n for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!bool":
			return "boolean " + n.Value
		case "!!int", "!!float":
			return "number " + n.Value
		default:
			return fmt.Sprintf("string %q", n.Value)
		}
	}
	return "an alias"
}

// field is one key/value pair of a YAML mapping.
type field struct {
	key  string
	k, v *yaml.Node
}

// fields returns the pairs of the mapping n in file order, with merge keys
// (<<) expanded: explicit keys win over merged ones, and earlier merged
// mappings over later ones. It reports duplicate keys and keys that are not
// scalars.
func (p *parser) fields(n *yaml.Node) []field {
	if p.merging[n] {
		p.errorf(n, "a merge key (<<) brings in the mapping that contains it")
		return nil
	}
	out := fieldList{fields: make([]field, 0, len(n.Content)/2)}
	var merged []field
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := p.resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, "a mapping key must be a string, got %s", describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			if p.merging == nil {
				p.merging = make(map[*yaml.Node]bool)
			}
			p.merging[n] = true
			merged = append(merged, p.mergeFields(v)...)
			delete(p.merging, n)
			continue
		}
		if first := out.find(k.Value); first != nil {
			p.errorf(k, "duplicate key %q (first at %d:%d)", k.Value, first.Line, first.Column)
			continue
		}
		out.add(field{key: k.Value, k: k, v: v})
	}
	for _, f := range merged {
		if out.find(f.key) == nil {
			out.add(f)
		}
	}
	return out.fields
}

// smallMapping is the most fields found by a scan; past it (a metadata map
// of thousands of keys, a merge of one) they are found through a map.
const smallMapping = 16

// fieldList is the fields of a mapping being read, found by key.
type fieldList struct {
	fields []field
	byKey  map[string]*yaml.Node // nil while there are few fields
}

// find returns the key node of the field called key, or nil.
func (l *fieldList) find(key string) *yaml.Node {
	if l.byKey != nil {
		return l.byKey[key]
	}
	for _, f := range l.fields {
		if f.key == key {
			return f.k
		}
	}
	return nil
}

func (l *fieldList) add(f field) {
	l.fields = append(l.fields, f)
	switch {
	case l.byKey != nil:
		l.byKey[f.key] = f.k
	case len(l.fields) > smallMapping:
		l.byKey = make(map[string]*yaml.Node, 2*len(l.fields))
		for _, f := range l.fields {
			l.byKey[f.key] = f.k
		}
	}
}

// mergeFields returns the pairs that a merge key's value brings in.
func (p *parser) mergeFields(v *yaml.Node) []field {
	v = p.resolve(v)
	switch v.Kind {
	case yaml.MappingNode:
		return p.fields(v)
	case yaml.SequenceNode:
		var out []field
		for _, item := range v.Content {
			item = p.resolve(item)
			if item.Kind != yaml.MappingNode {
				p.errorf(item, "a merge key (<<) takes mappings, got %s", describe(item))
				continue
			}
			out = append(out, p.fields(item)...)
		}
		return out
	}
	if !isNull(v) {
		p.errorf(v, "a merge key (<<) takes a mapping or a list of mappings, got %s", describe(v))
	}
	return nil
}

// mapping resolves f's value and reports it unless it is a mapping; null
// counts as absent (nil, no error).
func (p *parser) mapping(f field) *yaml.Node {
	v := p.resolve(f.v)
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.MappingNode {
		p.errorf(v, "%s must be a mapping, got %s", f.key, describe(v))
		return nil
	}
	return v
}

// list resolves f's value and its items; null counts as an empty list.
func (p *parser) list(f field) []*yaml.Node {
	v := p.resolve(f.v)
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		p.errorf(v, "%s must be a list, got %s", f.key, describe(v))
		return nil
	}
	items := make([]*yaml.Node, len(v.Content))
	for i, item := range v.Content {
		items[i] = p.resolve(item)
	}
	return items
}

// str returns f's value as text. Any scalar is accepted as written (as
// yaml.v2 does for envoyproxy/ratelimit: value: 200 is "200"); null is "".
func (p *parser) str(f field) (string, bool) {
	v := p.resolve(f.v)
	if v.Kind != yaml.ScalarNode {
		p.errorf(v, "%s must be a string, got %s", f.key, describe(v))
		return "", false
	}
	if isNull(v) {
		return "", true
	}
	return v.Value, true
}

const quotedStyles = yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle | yaml.LiteralStyle | yaml.FoldedStyle

// boolean returns f's value as a bool: true/false in any of YAML's
// spellings, and the YAML 1.1 forms (yes, no, on, off, ...) that yaml.v2
// accepts; null is false.
func (p *parser) boolean(f field) bool {
	v := p.resolve(f.v)
	if v.Kind == yaml.ScalarNode {
		if isNull(v) {
			return false
		}
		tag := v.ShortTag()
		if tag == "!!bool" || (tag == "!!str" && v.Style&quotedStyles == 0) {
			if b, ok := boolWords[v.Value]; ok {
				return b
			}
		}
	}
	p.errorf(v, "%s must be true or false, got %s", f.key, describe(v))
	return false
}

// boolWords are the spellings of booleans that yaml.v3 reads into a bool
// (yaml.v3's resolve and decode tables, YAML 1.2 and 1.1).
var boolWords = map[string]bool{
	"true": true, "True": true, "TRUE": true, "false": false, "False": false, "FALSE": false,
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

var integerText = regexp.MustCompile(`^[-+]?[0-9][0-9_]*$`)

// number returns f's value as a whole number in [0, max]; null is 0.
func (p *parser) number(f field, max uint64) (uint64, bool) {
	v := p.resolve(f.v)
	if isNull(v) {
		return 0, true
	}
	x, problem := WholeNumber(v, max)
	if problem != "" {
		p.errorf(v, "%s %s", f.key, problem)
		return 0, false
	}
	return x, true
}

// WholeNumber reads scalar n as a config file's whole number in [0, max]:
// as yaml.v3 reads an !!int, underscores dropped, then Go's syntax (0x, 0o,
// 0b, a leading 0 for octal). Otherwise problem says why, to follow the
// field's name ("must not be negative, got -1").
func WholeNumber(n *yaml.Node, max uint64) (v uint64, problem string) {
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!int":
			plain := strings.ReplaceAll(n.Value, "_", "")
			if x, err := strconv.ParseInt(plain, 0, 64); err == nil {
				if x < 0 {
					return 0, fmt.Sprintf("must not be negative, got %d", x)
				}
				if uint64(x) > max {
					return 0, fmt.Sprintf("%d is out of range (at most %d)", x, max)
				}
				return uint64(x), ""
			}
			if x, err := strconv.ParseUint(plain, 0, 64); err == nil {
				return 0, fmt.Sprintf("%d is out of range (at most %d)", x, max)
			}
		case "!!float":
			// yaml.v3 reads an integer too large for 64 bits as a float.
			if integerText.MatchString(n.Value) {
				if strings.HasPrefix(n.Value, "-") {
					return 0, "must not be negative, got " + n.Value
				}
				return 0, fmt.Sprintf("%s is out of range (at most %d)", n.Value, max)
			}
		}
	}
	return 0, "must be a whole number, got " + describe(n)
}

// uint32Field is number for the uint32 fields of a limit.
func (p *parser) uint32Field(f field) (uint32, bool) {
	x, ok := p.number(f, math.MaxUint32)
	return uint32(x), ok
}

// level is where a key sits in a domain document.
type level int

const (
	levelDomain level = iota
	levelDescriptor
	levelLimit
)

// levelKeys are the keys of each level; levelWhere says where that is.
var (
	levelKeys = [...][]string{
		levelDomain: {"domain", "descriptors", "http_descriptors"},
		levelDescriptor: {"key", "value", "descriptors", "rate_limit", "rate_limits", "shadow_mode", "quota_mode",
			"detailed_metric", "value_to_metric", "share_threshold", "metadata", "count_denied_hits"},
		levelLimit: {"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst",
			"unit_multiplier", "shadow_mode", "count_denied_hits", "calendar", "time_zone"},
	}
	levelWhere = [...]string{
		levelDomain:     "at the top of a document",
		levelDescriptor: "in a descriptor",
		levelLimit:      "in a rate_limit",
	}
)

// misplaced reports f, an unknown key of a domain, descriptor or limit: a key
// of another level says where it belongs.
func (p *parser) misplaced(f field, lv level) {
	if p.referenceKeys && referenceKeys[f.key] {
		p.ignoredReferenceKey(f, lv)
		return
	}
	for other, keys := range levelKeys {
		if level(other) != lv && slices.Contains(keys, f.key) {
			p.errorf(f.k, "key %q is not allowed %s (it belongs %s)", f.key, levelWhere[lv], levelWhere[other])
			return
		}
	}
	what := [...]string{levelDomain: "domain", levelDescriptor: "descriptor", levelLimit: "rate_limit"}[lv]
	p.unknown(f, what, levelKeys[lv])
}

// unknown reports f, a key that what does not have.
func (p *parser) unknown(f field, what string, allowed []string) {
	p.errorf(f.k, "unknown key %q in %s (%s)", f.key, what, suggest(f.key, allowed))
}

// suggest proposes the allowed key nearest to key, or lists them all.
func suggest(key string, allowed []string) string {
	if len(allowed) == 0 {
		return "it takes no keys"
	}
	best, bestDist := "", 3
	for _, a := range allowed {
		if d := editDistance(strings.ToLower(key), a); d < bestDist {
			best, bestDist = a, d
		}
	}
	if best != "" {
		return fmt.Sprintf("did you mean %q?", best)
	}
	return "allowed: " + strings.Join(allowed, ", ")
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// yamlErrorLine matches yaml.v3's syntax errors that carry a line.
var yamlErrorLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlAnchor matches yaml.v3's unknown-anchor error, which carries no line.
var yamlAnchor = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)

// syntaxError records an error of the YAML parser. yaml.v3 gives a line
// (or none: then it is line 1) but no column; the column is then 1.
func (p *parser) syntaxError(err error, data []byte) {
	msg := err.Error()
	line, col := 1, 1
	if m := yamlErrorLine.FindStringSubmatch(msg); m != nil {
		if n, convErr := strconv.Atoi(m[1]); convErr == nil && n > 0 {
			line = n
		}
		msg = m[2]
		// yaml.v3 numbers the lines of scanner errors from 1 but those of
		// parser errors from 0 (the start of the construct being parsed).
		if isParserProblem(msg) {
			line++
		}
	} else if m := yamlAnchor.FindStringSubmatch(msg); m != nil {
		line, col = locate(data, "*"+m[1])
		msg = strings.TrimPrefix(msg, "yaml: ")
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Column: col, Msg: "invalid YAML: " + msg})
}

// parserProblems are the messages of yaml.v3's parser (parserc.go), as
// opposed to its scanner.
var parserProblems = []string{
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"did not find expected '-' indicator",
	"did not find expected <document start>",
	"did not find expected <stream-start>",
	"did not find expected key",
	"did not find expected node content",
	"found duplicate %TAG directive",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found undefined tag handle",
}

func isParserProblem(msg string) bool {
	return slices.Contains(parserProblems, msg)
}

// locate returns the 1-based line and column of the first s in data, or 1:1.
func locate(data []byte, s string) (line, col int) {
	i := strings.Index(string(data), s)
	if i < 0 {
		return 1, 1
	}
	before := data[:i]
	line = 1 + strings.Count(string(before), "\n")
	col = i + 1
	if nl := strings.LastIndexByte(string(before), '\n'); nl >= 0 {
		col = i - nl
	}
	return line, col
}
