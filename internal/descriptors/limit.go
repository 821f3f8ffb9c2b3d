package descriptors

import (
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Bounds that keep the engines' arithmetic safe; validation says so.
const (
	// maxWindow is the longest window, unit_multiplier × unit.
	maxWindow = 100 * 365 * 24 * time.Hour
	// maxTokenSpan bounds burst × emission interval of a token_bucket, in
	// microseconds: the bucket's span stays exact in a float64 (Lua numbers).
	maxTokenSpan = 1 << 53
	// maxSlidingLog bounds requests_per_unit of a sliding_log, which keeps
	// one entry per admitted hit.
	maxSlidingLog = 100000
)

var (
	unitList      = strings.Join(unitNames[1:], "|")
	algorithmList = strings.Join(algorithmNames[:], "|")
	// unitCodes are the short forms of units in labels ("5m", "1d").
	unitCodes = [...]string{"", "s", "m", "h", "d", "w", "mo", "y"}
)

// parseUnit reads a unit name in any case.
func parseUnit(s string) (Unit, bool) {
	for u := Second; u <= Year; u++ {
		if strings.EqualFold(s, unitNames[u]) {
			return u, true
		}
	}
	return UnitUnknown, false
}

// parseAlgorithm reads an algorithm name in any case.
func parseAlgorithm(s string) (Algorithm, bool) {
	for a, name := range algorithmNames {
		if strings.EqualFold(s, name) {
			return Algorithm(a), true
		}
	}
	return FixedWindow, false
}

// limits parses a descriptor's rate_limit or rate_limits and checks that no
// two of them share a counter identity.
func (p *parser) limits(d *Descriptor, rateLimit, rateLimits field) []*Limit {
	nodes, what := p.limitNodes(rateLimit, rateLimits)
	var out []*Limit
	ids := make(map[string]*Limit, len(nodes))
	for _, n := range nodes {
		l := p.limit(n, d, what)
		if l == nil {
			continue
		}
		if l.Unlimited && len(nodes) > 1 {
			p.errorf(n, "an unlimited limit must be the only limit of its descriptor")
		}
		if l.ID != "" {
			if first, dup := ids[l.ID]; dup {
				p.errorf(n, "duplicate limit %s (same algorithm, window and name as the limit at %d:%d)", l.ID, first.Line, first.Column)
			} else {
				ids[l.ID] = l
			}
		}
		out = append(out, l)
	}
	distinctLabels(out)
	return out
}

// limitNodes returns the limits given by rate_limit or rate_limits (not
// both), and what to call one in messages.
func (p *parser) limitNodes(rateLimit, rateLimits field) ([]*yaml.Node, string) {
	var nodes []*yaml.Node
	what := "rate_limit"
	if rateLimits.k != nil {
		what = "rate_limits item"
		v := p.resolve(rateLimits.v)
		nodes = p.list(rateLimits)
		if v.Kind == yaml.SequenceNode && len(nodes) == 0 {
			p.errorf(v, "rate_limits is empty (leave it out for a descriptor without limits)")
		}
	}
	if rateLimit.k == nil {
		return nodes, what
	}
	v := p.resolve(rateLimit.v)
	if rateLimits.k != nil && !isNull(v) && !isNull(p.resolve(rateLimits.v)) {
		second := rateLimit.k
		if rateLimits.k.Line > second.Line || (rateLimits.k.Line == second.Line && rateLimits.k.Column > second.Column) {
			second = rateLimits.k
		}
		p.errorf(second, "rate_limit and rate_limits are both set (use rate_limits for several limits)")
		return nil, what
	}
	switch {
	case isNull(v):
	case v.Kind == yaml.SequenceNode:
		p.errorf(v, "rate_limit must be a mapping, got a list (use rate_limits for several limits)")
	default:
		nodes = []*yaml.Node{v}
	}
	return nodes, what
}

// distinctLabels appends the algorithm to the labels of unnamed limits
// that would share one (same window, different algorithms), so that their
// metrics stay apart: "remote_address/1m" and "remote_address/1m/sliding_window".
// A fixed window keeps the bare label, so labels only change where they
// collided.
func distinctLabels(limits []*Limit) {
	seen := make(map[string]int, len(limits))
	for _, l := range limits {
		seen[l.Label]++
	}
	for _, l := range limits {
		switch {
		case seen[l.Label] <= 1 || l.Name != "":
		case l.Calendar != nil:
			l.Label += "/calendar"
		case l.Algorithm != FixedWindow:
			l.Label += "/" + l.Algorithm.String()
		}
	}
}

// limitFields are the fields of one limit as given (non-null), for the
// checks that relate them.
type limitFields struct {
	unit, rpu, alg, burst, mult field // k is nil when not given
	calendar, zone              field
	replaceNodes                []*yaml.Node
	shadow                      bool // the limit's own shadow_mode
	countDenied                 bool // the limit's own count_denied_hits
	unitBad                     bool // unit given but not a string (reported)
	bad                         bool // a field did not parse (reported): skip the checks that relate fields
}

// limit parses and validates one limit of d, in phases: its fields, then
// either the unlimited rules or its window and algorithm, then its identity.
// what names it in messages.
func (p *parser) limit(n *yaml.Node, d *Descriptor, what string) *Limit {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, "%s must be a mapping, got %s", what, describe(n))
		return nil
	}
	l := &Limit{Descriptor: d, UnitMultiplier: 1}
	l.Line, l.Column = at(n)
	g := p.limitFields(n, l)
	l.Shadow = g.shadow || d.ShadowMode
	l.CountDeniedHits = g.countDenied || d.CountDeniedHits
	for i, r := range l.Replaces {
		if r != "" && r == l.Name {
			p.errorf(g.replaceNodes[i], "replaces names this limit itself (%q)", r)
		}
	}
	if l.Unlimited {
		p.unlimited(n, l, g)
		return l
	}
	if !p.window(n, l, g) {
		return l
	}
	p.algorithm(l, g)
	p.calendar(l, g)
	l.ID = CounterID(l.Algorithm, l.Window, l.Name)
	if l.Calendar != nil {
		l.ID = CalendarCounterID(l.Unit, l.Calendar, l.Name)
	}
	l.Label = l.Name
	if window := compactWindow(l); l.Label == "" && p.spendNames(len(d.Path)+1+len(window), n) {
		l.Label = d.Path + "/" + window
	}
	return l
}

// limitFields decodes the fields of the limit n into l and returns what
// was given.
func (p *parser) limitFields(n *yaml.Node, l *Limit) limitFields {
	var g limitFields
	var ok bool
	for _, f := range p.fields(n) {
		given := !isNull(p.resolve(f.v))
		switch f.key {
		case "unit":
			var s string
			s, ok = p.str(f)
			g.unitBad = !ok
			if ok && s != "" {
				g.unit = f
				if l.Unit, ok = parseUnit(s); !ok {
					p.errorf(f.v, "unit %q is not one of %s", s, unitList)
				}
			}
			g.bad = g.bad || !ok
		case "requests_per_unit":
			if given {
				g.rpu = f
			}
			l.RequestsPerUnit, ok = p.uint32Field(f)
			g.bad = g.bad || !ok
		case "unlimited":
			l.Unlimited = p.boolean(f)
		case "name":
			l.Name, _ = p.str(f)
		case "replaces":
			l.Replaces, g.replaceNodes = p.replaces(f)
		case "algorithm":
			var s string
			if s, ok = p.str(f); ok && s != "" {
				g.alg = f
				if l.Algorithm, ok = parseAlgorithm(s); !ok {
					p.errorf(f.v, "algorithm %q is not one of %s", s, algorithmList)
				}
			}
			g.bad = g.bad || !ok
		case "burst":
			if given {
				g.burst = f
			}
			l.Burst, ok = p.uint32Field(f)
			g.bad = g.bad || !ok
		case "unit_multiplier":
			if given {
				g.mult = f
				if l.UnitMultiplier, ok = p.uint32Field(f); ok && l.UnitMultiplier == 0 {
					p.errorf(f.v, "unit_multiplier must be at least 1")
					ok = false
				}
				g.bad = g.bad || !ok
			}
		case "shadow_mode":
			g.shadow = p.boolean(f)
		case "count_denied_hits":
			g.countDenied = p.boolean(f)
		case "calendar":
			if p.boolean(f) {
				g.calendar = f
			}
		case "time_zone":
			if given {
				g.zone = f
			}
		default:
			p.misplaced(f, levelLimit)
		}
	}
	return g
}

// unlimited checks and completes an unlimited limit: it has no unit,
// window or algorithm. requests_per_unit is ignored, as envoyproxy/ratelimit
// ignores it: files it accepts must load here.
func (p *parser) unlimited(n *yaml.Node, l *Limit, g limitFields) {
	for _, f := range [...]field{g.unit, g.alg, g.burst, g.mult} {
		if f.k == nil {
			continue
		}
		if f.key == "unit" {
			p.errorf(f.k, "should not specify rate limit unit when unlimited")
		} else {
			p.errorf(f.k, "should not specify %s when unlimited", f.key)
		}
	}
	l.Unit, l.UnitMultiplier, l.RequestsPerUnit, l.Algorithm, l.Burst = UnitUnknown, 0, 0, FixedWindow, 0
	l.ID = "unlimited" + nameSuffix(l.Name)
	l.Label = l.Name
	if l.Label == "" && p.spendNames(len(l.Descriptor.Path)+len("/unlimited"), n) {
		l.Label = l.Descriptor.Path + "/unlimited"
	}
}

// window sets l.Window from its unit and multiplier, and reports whether
// the limit is sound enough for the checks that follow.
func (p *parser) window(n *yaml.Node, l *Limit, g limitFields) bool {
	if g.unit.k == nil {
		if !g.unitBad {
			p.errorf(n, "unit is required (one of %s), or unlimited: true", unitList)
		}
		return false
	}
	if g.bad {
		return false // reported
	}
	if time.Duration(l.UnitMultiplier) > maxWindow/l.Unit.Duration() {
		at := g.unit.v
		if g.mult.k != nil {
			at = g.mult.v
		}
		p.errorf(at, "window %d × %s is longer than 100 years", l.UnitMultiplier, l.Unit)
		return false
	}
	l.Window = time.Duration(l.UnitMultiplier) * l.Unit.Duration()
	return true
}

// calendar reads calendar: true and time_zone: a fixed window of one day,
// ISO week, month or year of a time zone's calendar.
func (p *parser) calendar(l *Limit, g limitFields) {
	if g.calendar.k == nil {
		if g.zone.k != nil {
			p.errorf(g.zone.k, "time_zone is only for calendar: true limits")
		}
		return
	}
	switch {
	case l.Unit < Day:
		p.errorf(g.calendar.k, "calendar: true needs unit day, week, month or year, not %s", l.Unit)
		return
	case l.Algorithm != FixedWindow:
		p.errorf(g.calendar.k, "calendar: true is for algorithm fixed_window, not %s (a calendar window is a fixed window)", l.Algorithm)
		return
	case l.UnitMultiplier != 1:
		p.errorf(g.calendar.k, "calendar: true counts one %s at a time: unit_multiplier must be 1, not %d", l.Unit, l.UnitMultiplier)
		return
	}
	l.Calendar = time.UTC
	if g.zone.k == nil {
		return
	}
	name, ok := p.str(g.zone)
	if !ok {
		return
	}
	loc, err := time.LoadLocation(name)
	if err != nil || name == "" || name == "Local" {
		p.errorf(g.zone.v, "time_zone %q is not an IANA time zone name (such as Europe/Paris or UTC)", name)
		return
	}
	l.Calendar = loc
}

// algorithm checks the fields that depend on l's algorithm.
func (p *parser) algorithm(l *Limit, g limitFields) {
	if g.burst.k != nil && l.Algorithm != TokenBucket {
		p.errorf(g.burst.k, "burst is only for algorithm token_bucket, not %s", l.Algorithm)
	}
	switch l.Algorithm {
	case TokenBucket:
		p.tokenBucket(l, g.rpu, g.burst)
	case SlidingLog:
		if l.RequestsPerUnit > maxSlidingLog {
			p.errorf(g.rpu.v, "requests_per_unit %d is too large for sliding_log (at most %d: it keeps one entry per hit; use sliding_window)",
				l.RequestsPerUnit, maxSlidingLog)
		}
	default:
		l.Burst = 0
	}
}

// tokenBucket defaults and bounds burst: one token per microsecond at most,
// and the bucket's span (burst × emission interval) within 2^53 µs.
func (p *parser) tokenBucket(l *Limit, rpuF, burstF field) {
	if burstF.k == nil {
		l.Burst = l.RequestsPerUnit
	}
	windowMicros := uint64(l.Window / time.Microsecond)
	switch {
	case l.RequestsPerUnit == 0:
		if l.Burst > 0 {
			p.errorf(burstF.v, "burst %d needs requests_per_unit above 0 (a token_bucket with requests_per_unit 0 denies every request)", l.Burst)
		}
		return
	case burstF.k != nil && l.Burst == 0:
		p.errorf(burstF.v, "burst must be at least 1 when requests_per_unit is above 0 (a bucket of 0 admits nothing)")
		return
	case uint64(l.RequestsPerUnit) > windowMicros:
		p.errorf(rpuF.v, "requests_per_unit %d per %d %s is more than one token per microsecond (token_bucket allows at most 1000000 per second)",
			l.RequestsPerUnit, l.UnitMultiplier, l.Unit)
		return
	}
	interval := (windowMicros + uint64(l.RequestsPerUnit) - 1) / uint64(l.RequestsPerUnit)
	if uint64(l.Burst) > maxTokenSpan/interval {
		at := rpuF.v
		msg := "requests_per_unit %d (the default burst) × emission interval %dµs is more than 2^53µs (about 285 years)"
		if burstF.k != nil {
			at, msg = burstF.v, "burst %d × emission interval %dµs is more than 2^53µs (about 285 years)"
		}
		p.errorf(at, msg, l.Burst, interval)
	}
}

// replaces parses [{name: X}, ...], returning the names and their nodes.
func (p *parser) replaces(f field) ([]string, []*yaml.Node) {
	items := p.list(f)
	var names []string
	var nodes []*yaml.Node
	for _, item := range items {
		if item.Kind != yaml.MappingNode {
			p.errorf(item, "each replaces item must be a mapping like {name: other_limit}, got %s", describe(item))
			continue
		}
		var name string
		for _, nf := range p.fields(item) {
			if nf.key == "name" {
				name, _ = p.str(nf)
			} else {
				p.unknown(nf, "replaces item", []string{"name"})
			}
		}
		if name == "" {
			p.errorf(item, "replaces item has an empty name")
			continue
		}
		names = append(names, name)
		nodes = append(nodes, item)
	}
	return names, nodes
}

// compactWindow is a limit's window for labels and the dump: "1s", "5m".
func compactWindow(l *Limit) string {
	if l.Unlimited || l.Unit == UnitUnknown {
		return ""
	}
	return strconv.FormatUint(uint64(l.UnitMultiplier), 10) + unitCodes[l.Unit]
}
