package config

import (
	"strconv"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/strictyaml"
)

var (
	unitList      = engine.UnitNames()
	algorithmList = engine.AlgorithmNames()
)

// limits parses a descriptor's rate_limit or rate_limits and checks that no
// two of them share a counter identity.
func (p *parser) limits(d *Descriptor, rateLimit, rateLimits strictyaml.Field) []*Limit {
	nodes, what := p.limitNodes(rateLimit, rateLimits)
	var out []*Limit
	var outNodes []*yaml.Node
	ids := make(map[string]*Limit, len(nodes))
	for _, n := range nodes {
		l := p.limit(n, d, what)
		if l == nil {
			continue
		}
		outNodes = append(outNodes, n)
		if l.Unlimited && len(nodes) > 1 {
			p.Errorf(n, "an unlimited limit must be the only limit of its descriptor")
		}
		if id := l.ID(); id != "" {
			if first, dup := ids[id]; dup {
				p.Errorf(n, "duplicate limit %s (same algorithm, window and name as the limit at %d:%d)", id, first.Line, first.Column)
			} else {
				ids[id] = l
			}
		}
		out = append(out, l)
	}
	p.concurrencyAlone(out, outNodes)
	distinctLabels(out)
	return out
}

// concurrencyAlone reports every rate limit beside a concurrency limit on
// one descriptor, at the rate limit's node (nodes[i] is limits[i]'s). A
// release (is_negative_hits) gives its hits back to every limit its
// descriptor reaches: the rate limit would take what a release gives back
// as never sent, and admit past its limit (150 a minute through a limit of
// 100 when each request is acquired and released).
func (p *parser) concurrencyAlone(limits []*Limit, nodes []*yaml.Node) {
	var cc *Limit
	for _, l := range limits {
		if l.Rule != nil && l.Rule.InFlight() {
			cc = l
			break
		}
	}
	if cc == nil {
		return
	}
	for i, l := range limits {
		if l.Rule == nil || l.Rule.InFlight() {
			continue // an unlimited limit beside another is reported
		}
		p.Errorf(nodes[i], "a %s limit beside the concurrency limit at %d:%d: the release of an acquisition (is_negative_hits) would give its hits back to this limit too; give the concurrency limit a descriptor of its own",
			l.Rule.Algorithm(), cc.Line, cc.Column)
	}
}

// limitNodes returns the limits given by rate_limit or rate_limits (not
// both), and what to call one in messages.
func (p *parser) limitNodes(rateLimit, rateLimits strictyaml.Field) ([]*yaml.Node, string) {
	var nodes []*yaml.Node
	what := "rate_limit"
	if rateLimits.Given() {
		what = "rate_limits item"
		v := p.Resolve(rateLimits.Value)
		nodes = p.List(rateLimits.Value, rateLimits.Key)
		if v.Kind == yaml.SequenceNode && len(nodes) == 0 {
			p.Errorf(v, "rate_limits is empty (leave it out for a descriptor without limits)")
		}
	}
	if !rateLimit.Given() {
		return nodes, what
	}
	v := p.Resolve(rateLimit.Value)
	if rateLimits.Given() && !strictyaml.IsNull(v) && !strictyaml.IsNull(p.Resolve(rateLimits.Value)) {
		second := rateLimit.KeyNode
		if rateLimits.KeyNode.Line > second.Line || (rateLimits.KeyNode.Line == second.Line && rateLimits.KeyNode.Column > second.Column) {
			second = rateLimits.KeyNode
		}
		p.Errorf(second, "rate_limit and rate_limits are both set (use rate_limits for several limits)")
		return nil, what
	}
	switch {
	case strictyaml.IsNull(v):
	case v.Kind == yaml.SequenceNode:
		p.Errorf(v, "rate_limit must be a mapping, got a list (use rate_limits for several limits)")
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
		case l.Rule == nil:
		case l.Rule.Calendar != nil:
			l.Label += "/calendar"
		case !l.Rule.DefaultAlgorithm():
			l.Label += "/" + l.Rule.Algorithm()
		}
	}
}

// limitFields are the fields of one limit as given (non-null), for the
// checks that relate them, and the spec they make.
type limitFields struct {
	spec                        engine.Spec
	unit, rpu, alg, burst, mult strictyaml.Field // absent when not given
	calendar, zone              strictyaml.Field
	lease                       strictyaml.Field // the limit's own lease, when given
	penalty, penaltyReset       strictyaml.Field
	leaseTTL                    strictyaml.Field
	reserve                     strictyaml.Field // the limit's own reserve, when given
	replaceNodes                []*yaml.Node
	shadow                      bool // the limit's own shadow_mode
	countDenied                 bool // the limit's own count_denied_hits
	unitBad                     bool // unit given but not a string (reported)
	bad                         bool // a field did not parse (reported): skip the checks that relate fields
}

// at returns the field of the spec field named name.
func (g *limitFields) at(name string) strictyaml.Field {
	switch name {
	case "unit":
		return g.unit
	case "requests_per_unit":
		return g.rpu
	case "algorithm":
		return g.alg
	case "burst":
		return g.burst
	case "unit_multiplier":
		return g.mult
	case "calendar":
		return g.calendar
	case "time_zone":
		return g.zone
	case "lease":
		return g.lease
	case "penalty":
		return g.penalty
	case "penalty_reset":
		return g.penaltyReset
	case "lease_ttl":
		return g.leaseTTL
	case "reserve":
		return g.reserve
	}
	return strictyaml.Field{}
}

// limit parses and validates one limit of d, in phases: its fields, then
// either the unlimited rules or its rule (engine.Compile), then its label.
// what names it in messages.
func (p *parser) limit(n *yaml.Node, d *Descriptor, what string) *Limit {
	if n.Kind != yaml.MappingNode {
		p.Errorf(n, "%s must be a mapping, got %s", what, strictyaml.Describe(n))
		return nil
	}
	l := &Limit{Descriptor: d}
	l.Line, l.Column = strictyaml.Pos(n)
	g := p.limitFields(n, l)
	l.Shadow = g.shadow || d.ShadowMode
	l.CountDeniedHits = g.countDenied || d.CountDeniedHits
	for i, r := range l.Replaces {
		if r != "" && r == l.Name {
			p.Errorf(g.replaceNodes[i], "replaces names this limit itself (%q)", r)
		}
	}
	if l.Unlimited {
		p.unlimited(n, l, g)
		return l
	}
	if !p.rule(n, l, &g) {
		return l
	}
	l.Label = l.Name
	if window := compactWindow(l); l.Label == "" && p.spendNames(len(d.Path)+1+len(window), n) {
		l.Label = d.Path + "/" + window
	}
	return l
}

// rule compiles the limit's fields into l.Rule, reporting each problem at
// its field, and reports whether it did.
func (p *parser) rule(n *yaml.Node, l *Limit, g *limitFields) bool {
	if !g.unit.Given() {
		if !g.unitBad {
			p.Errorf(n, "unit is required (one of %s), or unlimited: true", unitList)
		}
		return false
	}
	if g.bad {
		return false // reported
	}
	g.spec.Name = l.Name
	g.spec.Lease = g.spec.Lease || l.Descriptor.Lease
	if d := l.Descriptor; !g.reserve.Given() && d.Reserve != nil {
		g.spec.Reserve = engine.Some(*d.Reserve) // the descriptor's, for all its limits
		g.reserve = strictyaml.Field{Key: "reserve", KeyNode: d.reserveAt, Value: d.reserveAt}
	}
	if g.zone.Given() {
		g.spec.TimeZone.Set = true
		if g.calendar.Given() {
			// Its presence alone is a problem without calendar: true.
			g.spec.TimeZone.V, g.spec.TimeZone.Set = p.String(g.zone.Value, g.zone.Key)
		}
	}
	r, errs := engine.Compile(g.spec)
	for _, e := range errs {
		f := g.at(e.Field)
		at := f.Value
		if e.Key {
			at = f.KeyNode
		}
		if at == nil {
			at = n
		}
		p.Errorf(at, "%s", e.Msg)
	}
	l.Rule = r
	if r != nil && r.Reserve != nil && p.reservationKey == "" {
		p.Errorf(g.reserve.KeyNode, "reserve needs the domain's reservation_key: the descriptor entry that carries a request's id (such as request_id), with which a later call settles")
	}
	return r != nil
}

// limitFields decodes the fields of the limit n into l and returns what
// was given.
func (p *parser) limitFields(n *yaml.Node, l *Limit) limitFields {
	g := limitFields{spec: engine.Spec{Multiplier: 1}}
	var ok bool
	for _, f := range p.Fields(n) {
		given := !strictyaml.IsNull(p.Resolve(f.Value))
		switch f.Key {
		case "unit":
			var s string
			s, ok = p.String(f.Value, f.Key)
			g.unitBad = !ok
			if ok && s != "" {
				g.unit = f
				if g.spec.Unit, ok = engine.ParseUnit(s); !ok {
					p.Errorf(f.Value, "unit %q is not one of %s", s, unitList)
				}
			}
			g.bad = g.bad || !ok
		case "requests_per_unit":
			if given {
				g.rpu = f
			}
			g.spec.Limit, ok = p.uint32Field(f)
			g.bad = g.bad || !ok
		case "unlimited":
			l.Unlimited = p.Bool(f.Value, f.Key)
		case "name":
			l.Name, _ = p.String(f.Value, f.Key)
		case "replaces":
			l.Replaces, g.replaceNodes = p.replaces(f)
		case "algorithm":
			var s string
			if s, ok = p.String(f.Value, f.Key); ok && s != "" {
				g.alg, g.spec.Algorithm = f, s
				if ok = engine.IsAlgorithm(s); !ok {
					p.Errorf(f.Value, "algorithm %q is not one of %s", s, algorithmList)
				}
			}
			g.bad = g.bad || !ok
		case "burst":
			if given {
				g.burst = f
			}
			g.spec.Burst.V, ok = p.uint32Field(f)
			g.spec.Burst.Set = given
			g.bad = g.bad || !ok
		case "unit_multiplier":
			if given {
				g.mult = f
				if g.spec.Multiplier, ok = p.uint32Field(f); ok && g.spec.Multiplier == 0 {
					p.Errorf(f.Value, "unit_multiplier must be at least 1")
					ok = false
				}
				g.bad = g.bad || !ok
			}
		case "shadow_mode":
			g.shadow = p.Bool(f.Value, f.Key)
		case "count_denied_hits":
			g.countDenied = p.Bool(f.Value, f.Key)
		case "calendar":
			if p.Bool(f.Value, f.Key) {
				g.calendar, g.spec.Calendar = f, true
			}
		case "time_zone":
			if given {
				g.zone = f
			}
		case "lease":
			if given {
				g.lease = f
			}
			g.spec.Lease = p.Bool(f.Value, f.Key)
		case "penalty":
			if given {
				g.penalty = f
				g.spec.Penalty, ok = p.ladder(f)
				g.bad = g.bad || !ok
			}
		case "penalty_reset":
			if given {
				g.penaltyReset = f
				g.spec.PenaltyReset.V, ok = p.Duration(f.Value, f.Key)
				g.spec.PenaltyReset.Set = true
				g.bad = g.bad || !ok
			}
		case "lease_ttl":
			if given {
				g.leaseTTL = f
				g.spec.LeaseTTL.V, ok = p.Duration(f.Value, f.Key)
				g.spec.LeaseTTL.Set = true
				g.bad = g.bad || !ok
			}
		case "reserve":
			if given {
				g.reserve = f
				res := p.reserve(f)
				g.bad = g.bad || res == nil
				if res != nil {
					g.spec.Reserve = engine.Some(*res)
				}
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
	for _, f := range [...]strictyaml.Field{g.unit, g.alg, g.burst, g.mult, g.penalty, g.penaltyReset, g.leaseTTL, g.reserve} {
		if !f.Given() {
			continue
		}
		if f.Key == "unit" {
			p.Errorf(f.KeyNode, "should not specify rate limit unit when unlimited")
		} else {
			p.Errorf(f.KeyNode, "should not specify %s when unlimited", f.Key)
		}
	}
	l.Label = l.Name
	if l.Label == "" && p.spendNames(len(l.Descriptor.Path)+len("/unlimited"), n) {
		l.Label = l.Descriptor.Path + "/unlimited"
	}
}

// ladder parses a penalty: a list of durations ([2m, 10m, 1h]).
func (p *parser) ladder(f strictyaml.Field) ([]time.Duration, bool) {
	items := p.List(f.Value, f.Key)
	if len(items) == 0 {
		p.Errorf(f.Value, "penalty must be a non-empty list of durations, like [2m, 10m, 1h]")
		return nil, false
	}
	steps := make([]time.Duration, 0, len(items))
	for _, item := range items {
		d, ok := p.Duration(item, "each penalty step")
		if !ok {
			return nil, false
		}
		steps = append(steps, d)
	}
	return steps, true
}

// replaces parses [{name: X}, ...], returning the names and their nodes.
func (p *parser) replaces(f strictyaml.Field) ([]string, []*yaml.Node) {
	items := p.List(f.Value, f.Key)
	var names []string
	var nodes []*yaml.Node
	for _, item := range items {
		if item.Kind != yaml.MappingNode {
			p.Errorf(item, "each replaces item must be a mapping like {name: other_limit}, got %s", strictyaml.Describe(item))
			continue
		}
		var name string
		for _, nf := range p.Fields(item) {
			if nf.Key == "name" {
				name, _ = p.String(nf.Value, nf.Key)
			} else {
				p.Unknown(nf, "replaces item", []string{"name"})
			}
		}
		if name == "" {
			p.Errorf(item, "replaces item has an empty name")
			continue
		}
		names = append(names, name)
		nodes = append(nodes, item)
	}
	return names, nodes
}

// compactWindow is a limit's window for labels and the dump: "1s", "5m";
// its algorithm's name for a limit of requests in flight, whose unit means
// nothing.
func compactWindow(l *Limit) string {
	if l.Rule == nil {
		return ""
	}
	if l.Rule.InFlight() {
		return l.Rule.Algorithm()
	}
	return strconv.FormatUint(uint64(l.Rule.Multiplier), 10) + l.Rule.Unit.Code()
}

// reserve parses a reserve: {estimate: N, ttl: D}, both required; nil
// when it does not parse (reported). Its values are checked with the
// limit (engine.Compile).
func (p *parser) reserve(f strictyaml.Field) *engine.Reserve {
	v := p.Resolve(f.Value)
	if v.Kind != yaml.MappingNode {
		p.Errorf(f.Value, "reserve must be a mapping like {estimate: 4000, ttl: 5m}, got %s", strictyaml.Describe(v))
		return nil
	}
	var res engine.Reserve
	var estimate, ttl, ok bool
	good := true
	for _, rf := range p.Fields(v) {
		switch rf.Key {
		case "estimate":
			res.Estimate, ok = p.uint32Field(rf)
			estimate, good = true, good && ok
		case "ttl":
			res.TTL, ok = p.Duration(rf.Value, rf.Key)
			ttl, good = true, good && ok
		default:
			p.Unknown(rf, "reserve", []string{"estimate", "ttl"})
			good = false
		}
	}
	if !estimate || !ttl {
		p.Errorf(f.Value, "reserve needs estimate (the hits a request holds until it settles) and ttl (how long a hold lasts unsettled)")
		return nil
	}
	if !good {
		return nil
	}
	return &res
}
