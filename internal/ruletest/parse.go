package ruletest

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rlsproject/rls/internal/clientip"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/httpdesc"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/strictyaml"
)

// DefaultStart is a case's first instant when neither the case nor the
// file gives one: the top of a day (and so of a second, minute and hour),
// UTC.
var DefaultStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Bounds on a test file: it is read whole and every request it asks for is
// decided, so a file must not ask for unbounded work.
const (
	MaxFileBytes = 8 << 20
	MaxRepeat    = 1_000_000
)

// File is a parsed test file: its cases, in order. Run and RunCase only
// read it: it may be run concurrently.
type File struct {
	Name  string
	Cases []*Case
}

// Override is a runtime override that a case runs under (as
// /admin/overrides sets one), from its start, or from At after it.
type Override struct {
	Line, Column int
	Change       overrides.Change
	At           time.Duration
}

// Case is one timeline: requests from Start on, each step's verdict and
// statuses checked in order.
type Case struct {
	Name         string
	Line, Column int
	Start        time.Time
	Steps        []*Step
	// Overrides are set in order: the file's from the start, then the
	// case's, each at its At.
	Overrides []Override
}

// When says how a step's instant is given.
type When uint8

// The ways of giving a step's instant.
const (
	// Same: the instant of the previous step's last request (the case's
	// start for the first step).
	Same    When = iota
	At           // Offset after the case's start
	After        // Offset after the previous step's last request
	Instant      // Time itself
)

// Step is one request, sent Repeat times Every apart, with its
// expectations. Exactly one of Descriptors and HTTP is set.
type Step struct {
	Line, Column int
	When         When
	Offset       time.Duration
	Time         time.Time
	Domain       string
	Descriptors  []service.Descriptor
	HitsAddend   uint32
	HTTP         *httpdesc.StaticRequest
	Repeat       int
	Every        time.Duration
	// Expect is the overall code of every repetition.
	Expect service.Code
	// Statuses and Headers are checked on the last repetition.
	Statuses []StatusExpectation
	Headers  []HeaderExpectation
}

// StatusExpectation is what one descriptor's status must be; nil fields
// are not checked.
type StatusExpectation struct {
	Code      *service.Code
	Remaining *uint32
	// Reset is duration_until_reset as the wire carries it: in whole
	// seconds, rounded up.
	Reset *time.Duration
	// Limit is the binding limit's label (its name when it has one), ""
	// for none.
	Limit *string
}

// HeaderExpectation is a response header's value, or its absence.
type HeaderExpectation struct {
	Name   string
	Value  string
	Absent bool
}

// LoadFile reads and parses the test file at path.
func LoadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, strictyaml.ErrorList{{File: path, Line: 1, Column: 1, Msg: fmt.Sprintf("larger than %d bytes", MaxFileBytes)}}
	}
	return Parse(path, data)
}

// Parse parses a test file; name is used in errors. Every problem is
// returned in a strictyaml.ErrorList (config.ErrorList is the same type),
// each as file:line:col: message, as config files report theirs: the
// file is read with the config's strict reader, without aliases.
func Parse(name string, data []byte) (*File, error) {
	p := parser{strictyaml.NewReader(name, strictyaml.Options{RefuseAliases: "aliases are not supported in test files"})}
	var root *yaml.Node
	for doc := range p.Documents(data) {
		if root != nil {
			p.Errorf(doc, "one YAML document per test file")
			break
		}
		root = doc
	}
	if root == nil && len(p.Errors()) == 0 {
		return nil, strictyaml.ErrorList{{File: name, Line: 1, Column: 1, Msg: "empty test file (want tests:)"}}
	}
	var f *File
	if root != nil {
		f = p.document(root)
	}
	if errs := p.Errors(); len(errs) > 0 {
		return nil, strictyaml.ErrorList(strictyaml.SortErrors(errs))
	}
	return f, nil
}

// parser walks a test file's nodes with the strict reader, which collects
// every problem.
type parser struct{ *strictyaml.Reader }

func (p parser) str(n *yaml.Node, what string) string {
	s, _ := p.String(n, what)
	return s
}

func (p parser) instant(n *yaml.Node, what string) (time.Time, bool) {
	s, ok := p.String(n, what)
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		p.Errorf(n, "%s: %q is not an RFC 3339 instant (e.g. 2030-01-01T00:00:00Z)", what, s)
		return time.Time{}, false
	}
	return t, true
}

func (p parser) code(n *yaml.Node, what string) (service.Code, bool) {
	s, ok := p.String(n, what)
	if !ok {
		return 0, false
	}
	switch s {
	case "OK":
		return service.OK, true
	case "OVER_LIMIT":
		return service.OverLimit, true
	}
	p.Errorf(n, "%s: %q is not OK or OVER_LIMIT", what, s)
	return 0, false
}

// document parses the file: defaults, then the cases.
func (p parser) document(n *yaml.Node) *File {
	f := &File{Name: p.File()}
	fs := p.Object(n, "the test file", "domain", "start", "overrides", "tests")
	start, domain := DefaultStart, ""
	if v := fs["start"]; v != nil {
		start, _ = p.instant(v, "start")
	}
	if v := fs["domain"]; v != nil {
		domain = p.str(v, "domain")
	}
	var shared []Override
	if v := fs["overrides"]; v != nil {
		shared = p.overrides(v, domain, false)
	}
	tests := fs["tests"]
	if tests == nil {
		if n.Kind == yaml.MappingNode {
			p.Errorf(n, "no tests: (want a list of cases)")
		}
		return f
	}
	names := make(map[string]int)
	for _, cn := range p.List(tests, "tests") {
		c := p.testCase(cn, start, domain, shared)
		if c == nil {
			continue
		}
		if line, dup := names[c.Name]; dup {
			p.Errorf(cn, "duplicate test name %q (first at line %d)", c.Name, line)
		}
		names[c.Name] = c.Line
		f.Cases = append(f.Cases, c)
	}
	if len(tests.Content) == 0 && tests.Kind == yaml.SequenceNode {
		p.Errorf(tests, "tests: no cases")
	}
	return f
}

func (p parser) testCase(n *yaml.Node, start time.Time, domain string, shared []Override) *Case {
	fs := p.Object(n, "a test", "name", "start", "domain", "overrides", "steps")
	c := &Case{Start: start, Overrides: shared}
	c.Line, c.Column = strictyaml.Pos(n)
	if v := fs["name"]; v != nil {
		c.Name = p.str(v, "name")
	}
	if c.Name == "" && n.Kind == yaml.MappingNode {
		p.Errorf(n, "a test needs a name")
	}
	if v := fs["start"]; v != nil {
		c.Start, _ = p.instant(v, "start")
	}
	if v := fs["domain"]; v != nil {
		domain = p.str(v, "domain")
	}
	if v := fs["overrides"]; v != nil {
		c.Overrides = append(slices.Clip(shared), p.overrides(v, domain, true)...)
	}
	steps := fs["steps"]
	if steps == nil {
		if n.Kind == yaml.MappingNode {
			p.Errorf(n, "test %q has no steps", c.Name)
		}
		return c
	}
	for _, sn := range p.List(steps, "steps") {
		c.Steps = append(c.Steps, p.step(sn, domain))
	}
	if steps.Kind == yaml.SequenceNode && len(steps.Content) == 0 {
		p.Errorf(steps, "test %q has no steps", c.Name)
	}
	return c
}

func (p parser) step(n *yaml.Node, domain string) *Step {
	fs := p.Object(n, "a step", "at", "after", "instant", "domain", "descriptors", "http", "hits", "repeat", "every", "expect", "statuses", "headers")
	s := &Step{Domain: domain, Repeat: 1}
	s.Line, s.Column = strictyaml.Pos(n)
	var timed *yaml.Node
	for _, key := range []string{"at", "after", "instant"} {
		v := fs[key]
		if v == nil {
			continue
		}
		if timed != nil {
			p.Errorf(v, "a step has one of at, after and instant")
			continue
		}
		timed = v
		switch key {
		case "at":
			s.When = At
			s.Offset, _ = p.Duration(v, key)
		case "after":
			s.When = After
			s.Offset, _ = p.Duration(v, key)
		case "instant":
			s.When = Instant
			s.Time, _ = p.instant(v, key)
		}
	}
	if v := fs["domain"]; v != nil {
		s.Domain = p.str(v, "domain")
	}
	if s.Domain == "" && n.Kind == yaml.MappingNode {
		p.Errorf(n, "a step needs a domain (on the step, its test or the file)")
	}
	switch d, h := fs["descriptors"], fs["http"]; {
	case d != nil && h != nil:
		p.Errorf(h, "a step has descriptors or http, not both")
	case d != nil:
		for i, dn := range p.List(d, "descriptors") {
			s.Descriptors = append(s.Descriptors, p.descriptor(dn, fmt.Sprintf("descriptors[%d]", i)))
		}
		if d.Kind == yaml.SequenceNode && len(d.Content) == 0 {
			p.Errorf(d, "descriptors: none")
		}
	case h != nil:
		s.HTTP = p.httpRequest(h)
	case n.Kind == yaml.MappingNode:
		p.Errorf(n, "a step needs descriptors or http")
	}
	if v := fs["hits"]; v != nil {
		if s.HTTP != nil {
			p.Errorf(v, "hits: an http step counts 1 hit per descriptor")
		}
		h, _ := p.Number(v, "hits", math.MaxUint32)
		s.HitsAddend = uint32(h)
	}
	if v := fs["repeat"]; v != nil {
		if r, ok := p.Number(v, "repeat", math.MaxUint64); ok {
			if r == 0 || r > MaxRepeat {
				p.Errorf(v, "repeat: %d is not from 1 to %d", r, MaxRepeat)
			}
			s.Repeat = int(min(r, MaxRepeat))
		}
	}
	if v := fs["every"]; v != nil {
		s.Every, _ = p.Duration(v, "every")
	}
	if v := fs["expect"]; v != nil {
		s.Expect, _ = p.code(v, "expect")
	} else if n.Kind == yaml.MappingNode {
		p.Errorf(n, "a step needs expect: OK or expect: OVER_LIMIT")
	}
	if v := fs["statuses"]; v != nil {
		for i, sn := range p.List(v, "statuses") {
			s.Statuses = append(s.Statuses, p.status(sn, fmt.Sprintf("statuses[%d]", i)))
		}
		if s.Descriptors != nil && len(s.Statuses) > len(s.Descriptors) {
			p.Errorf(v, "statuses: %d for %d descriptors", len(s.Statuses), len(s.Descriptors))
		}
	}
	if v := fs["headers"]; v != nil {
		s.Headers = p.headers(v)
	}
	return s
}

// descriptor parses "key=value[,key=value...]", a list of {key, value}
// entries, or a mapping with entries and, optionally, hits, refund and
// limit.
func (p parser) descriptor(n *yaml.Node, what string) service.Descriptor {
	var d service.Descriptor
	switch n.Kind {
	case yaml.ScalarNode:
		d.Entries = p.entryText(n, what)
		return d
	case yaml.SequenceNode:
		d.Entries = p.entryList(n, what)
		return d
	}
	fs := p.Object(n, what, "entries", "hits", "refund", "limit")
	switch e := fs["entries"]; {
	case e == nil:
		if n.Kind == yaml.MappingNode {
			p.Errorf(n, "%s needs entries", what)
		}
	case e.Kind == yaml.ScalarNode:
		d.Entries = p.entryText(e, what+".entries")
	default:
		d.Entries = p.entryList(e, what+".entries")
	}
	if v := fs["hits"]; v != nil {
		d.HasHits = true
		d.Hits, _ = p.Number(v, what+".hits", math.MaxUint32)
	}
	if v := fs["refund"]; v != nil {
		d.Refund = p.Bool(v, what+".refund")
	}
	if v := fs["limit"]; v != nil {
		d.Override = p.override(v, what+".limit")
	}
	return d
}

// entryList parses a list of {key: K, value: V}.
func (p parser) entryList(n *yaml.Node, what string) []engine.Entry {
	var out []engine.Entry
	items := p.List(n, what)
	for i, en := range items {
		where := fmt.Sprintf("%s[%d]", what, i)
		efs := p.Object(en, where, "key", "value")
		var entry engine.Entry
		if k := efs["key"]; k != nil {
			entry.Key = p.str(k, where+".key")
		}
		if v := efs["value"]; v != nil {
			entry.Value = p.str(v, where+".value")
		}
		if entry.Key == "" && en.Kind == yaml.MappingNode {
			p.Errorf(en, "%s needs a key", where)
		}
		out = append(out, entry)
	}
	if len(out) == 0 && n.Kind == yaml.SequenceNode {
		p.Errorf(n, "%s: no entries", what)
	}
	return out
}

// entryText parses "key=value[,key=value...]" (as rls check takes it).
func (p parser) entryText(n *yaml.Node, what string) []engine.Entry {
	s, ok := p.String(n, what)
	if !ok {
		return nil
	}
	var out []engine.Entry
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			p.Errorf(n, "%s: %q: entries are key=value, separated by commas (a value with a comma needs the entries: [{key: K, value: V}] form)", what, s)
			return nil
		}
		out = append(out, engine.Entry{Key: k, Value: v})
	}
	return out
}

func (p parser) override(n *yaml.Node, what string) *service.Override {
	fs := p.Object(n, what, "requests_per_unit", "unit", "unit_multiplier")
	o := &service.Override{}
	if v := fs["requests_per_unit"]; v != nil {
		r, _ := p.Number(v, what+".requests_per_unit", math.MaxUint32)
		o.RequestsPerUnit = uint32(r)
	} else if n.Kind == yaml.MappingNode {
		p.Errorf(n, "%s needs requests_per_unit", what)
	}
	if v := fs["unit"]; v != nil {
		s := p.str(v, what+".unit")
		var ok bool
		if o.Unit, ok = engine.ParseUnit(s); !ok {
			p.Errorf(v, "%s.unit: %q is not one of %s", what, s, engine.UnitNames())
		}
	} else if n.Kind == yaml.MappingNode {
		p.Errorf(n, "%s needs a unit", what)
	}
	if v := fs["unit_multiplier"]; v != nil {
		m, _ := p.Number(v, what+".unit_multiplier", math.MaxUint32)
		o.UnitMultiplier = uint32(m)
	}
	return o
}

// overrides parses a list of runtime overrides, as /admin/overrides takes
// them: {descriptor, requests_per_unit, and optionally domain (default:
// the file's or the case's), name, burst, ttl, reason; at, in a case}.
func (p parser) overrides(n *yaml.Node, domain string, inCase bool) []Override {
	keys := []string{"domain", "descriptor", "name", "requests_per_unit", "burst", "ttl", "reason"}
	if inCase {
		keys = append(keys, "at")
	}
	var out []Override
	for i, on := range p.List(n, "overrides") {
		what := fmt.Sprintf("overrides[%d]", i)
		fs := p.Object(on, what, keys...)
		o := Override{Change: overrides.Change{Key: overrides.Key{Domain: domain}}}
		o.Line, o.Column = strictyaml.Pos(on)
		if v := fs["domain"]; v != nil {
			o.Change.Domain = p.str(v, what+".domain")
		}
		switch d := fs["descriptor"]; {
		case d == nil:
			if on.Kind == yaml.MappingNode {
				p.Errorf(on, "%s needs a descriptor (\"key=value[,key=value...]\"; a value may end in '*')", what)
			}
		case d.Kind == yaml.ScalarNode:
			o.Change.Descriptor = p.entryText(d, what+".descriptor")
		default:
			o.Change.Descriptor = p.entryList(d, what+".descriptor")
		}
		if v := fs["name"]; v != nil {
			o.Change.Name = p.str(v, what+".name")
		}
		if v := fs["requests_per_unit"]; v != nil {
			r, _ := p.Number(v, what+".requests_per_unit", math.MaxUint32)
			o.Change.RequestsPerUnit = uint32(r)
		} else if on.Kind == yaml.MappingNode {
			p.Errorf(on, "%s needs requests_per_unit (0 blocks every request)", what)
		}
		if v := fs["burst"]; v != nil {
			b, _ := p.Number(v, what+".burst", math.MaxUint32)
			o.Change.Burst = engine.Some(uint32(b))
		}
		if v := fs["ttl"]; v != nil {
			if d, ok := p.Duration(v, what+".ttl"); ok {
				if d <= 0 {
					p.Errorf(v, "%s.ttl: %s is not positive", what, d)
				}
				o.Change.TTL = d
			}
		}
		if v := fs["reason"]; v != nil {
			o.Change.Reason = p.str(v, what+".reason")
		}
		if v := fs["at"]; v != nil {
			if d, ok := p.Duration(v, what+".at"); ok {
				if d < 0 {
					p.Errorf(v, "%s.at: %s is before the case's start", what, d)
				}
				o.At = d
			}
		}
		if o.Change.Domain == "" && on.Kind == yaml.MappingNode {
			p.Errorf(on, "%s needs a domain (on it, its test or the file)", what)
		}
		out = append(out, o)
	}
	return out
}

func (p parser) httpRequest(n *yaml.Node) *httpdesc.StaticRequest {
	fs := p.Object(n, "http", "method", "path", "authority", "headers", "client")
	r := &httpdesc.StaticRequest{}
	if v := fs["method"]; v != nil {
		r.Method = p.str(v, "http.method")
	}
	if v := fs["path"]; v != nil {
		r.Path = p.str(v, "http.path")
	}
	if v := fs["authority"]; v != nil {
		r.Authority = p.str(v, "http.authority")
	}
	if v := fs["client"]; v != nil {
		s := p.str(v, "http.client")
		a, ok := clientip.Parse(s)
		if !ok && s != "" {
			p.Errorf(v, "http.client: %q is not an IP address", s)
		}
		r.Client = a
	}
	if v := fs["headers"]; v != nil {
		names := p.nameMapping(v, "http.headers must be a mapping of names to values")
		if names == nil {
			return r
		}
		r.Headers = make(map[string]string)
		for _, f := range names {
			name := strings.ToLower(f.Key)
			if _, dup := r.Headers[name]; dup {
				p.Errorf(f.KeyNode, "duplicate header %q", name)
			}
			r.Headers[name] = p.str(f.Value, fmt.Sprintf("header %q", f.Key))
		}
	}
	return r
}

// nameMapping returns the fields of n, a mapping of header names to
// values; anything else is reported with what it must be.
func (p parser) nameMapping(n *yaml.Node, must string) []strictyaml.Field {
	v := p.Resolve(n)
	if v.Kind != yaml.MappingNode {
		p.Errorf(v, "%s, got %s", must, strictyaml.Describe(v))
		return nil
	}
	return p.Fields(v)
}

func (p parser) status(n *yaml.Node, what string) StatusExpectation {
	fs := p.Object(n, what, "code", "remaining", "reset", "limit")
	var e StatusExpectation
	if v := fs["code"]; v != nil {
		if c, ok := p.code(v, what+".code"); ok {
			e.Code = &c
		}
	}
	if v := fs["remaining"]; v != nil {
		if v.Kind == yaml.ScalarNode && v.Value == "unlimited" {
			r := uint32(math.MaxUint32)
			e.Remaining = &r
		} else if r, ok := p.Number(v, what+".remaining", math.MaxUint32); ok {
			r32 := uint32(r)
			e.Remaining = &r32
		}
	}
	if v := fs["reset"]; v != nil {
		if d, ok := p.Duration(v, what+".reset"); ok {
			if d%time.Second != 0 || d < 0 {
				p.Errorf(v, "%s.reset: %s is not whole seconds (duration_until_reset is sent in whole seconds, rounded up)", what, d)
			}
			e.Reset = &d
		}
	}
	if v := fs["limit"]; v != nil {
		var l string
		if !strictyaml.IsNull(v) {
			l = p.str(v, what+".limit")
		}
		e.Limit = &l
	}
	if len(fs) == 0 && n.Kind == yaml.MappingNode {
		p.Errorf(n, "%s expects nothing (code, remaining, reset or limit)", what)
	}
	return e
}

func (p parser) headers(n *yaml.Node) []HeaderExpectation {
	var out []HeaderExpectation
	for _, f := range p.nameMapping(n, "headers must be a mapping of names to values (null: absent)") {
		if strictyaml.IsNull(p.Resolve(f.Value)) {
			out = append(out, HeaderExpectation{Name: f.Key, Absent: true})
			continue
		}
		out = append(out, HeaderExpectation{Name: f.Key, Value: p.str(f.Value, fmt.Sprintf("header %q", f.Key))})
	}
	return out
}
