package service

import (
	"context"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/httpdesc"
	"github.com/rlsproject/rls/internal/overrides"
)

// Explanation says how the service would resolve a request and what its
// limits hold now, found without consuming anything (POST /debug/explain,
// which the HTTP transport writes as JSON). A value, built per call.
type Explanation struct {
	Domain string
	// Config is the config the request was explained against, nil when
	// none is loaded; Dom is its domain, nil when it has none: every
	// descriptor is then answered OK with no limit.
	Config *config.Config
	Dom    *config.Domain
	// Code is what the request would get if it came now, as the store
	// judges it in a dry run (engine.Store.Peek); Never says that it can
	// never pass as it is (more hits than a limit or a bucket admits).
	Code  Code
	Never bool
	// StoreErr is set when the limits' state could not be read: the
	// limits are then listed without state, and the codes say nothing.
	StoreErr error
	// HTTP, for an HTTP request, is what each item of the domain's
	// http_descriptors made of it, in order; the descriptors made are
	// Descriptors, in the same order.
	HTTP        []httpdesc.Trace
	Descriptors []DescriptorExplanation
}

// DescriptorExplanation is one request descriptor: what it matched and
// its limits.
type DescriptorExplanation struct {
	Entries []config.Entry
	// Hits are the hits the request would take (0: only a look); Refund
	// gives them back.
	Hits   uint64
	Refund bool
	// Override says the request's own limit applies: the config is not
	// consulted, and Match is unset.
	Override bool
	// Match is how the entries walked the domain's tree (Match.Node is
	// the node reached).
	Match config.Trace
	// Limits are the limits of the matched node (or the override), each
	// with what the request does with it.
	Limits []LimitExplanation
	// Code is this descriptor's status if the request came now.
	Code Code
}

// Applies is what a request does with one of its limits, as an
// explanation says it.
type Applies uint8

// What a request does with a limit.
const (
	Enforced  Applies = iota // counted, and may deny
	Shadow                   // counted, never denies
	Unlimited                // the descriptor is not counted
	Replaced                 // another limit of the request replaces it by name
)

var appliesNames = [...]string{"enforced", "shadow", "unlimited", "replaced"}

func (a Applies) String() string { return appliesNames[a] }

// LimitExplanation is one limit of a descriptor.
type LimitExplanation struct {
	Limit   *config.Limit
	Applies Applies
	// ReplacedBy are the labels of the limits of the request whose
	// replaces drop a Replaced limit.
	ReplacedBy []string
	// LeaseTTL is a concurrency limit's lease_ttl (its window); 0 for the
	// other algorithms.
	LeaseTTL time.Duration
	// Policy is how answers advertise the limit (X-RateLimit-Limit,
	// RateLimit-Policy), and State the counter now with this limit's
	// verdict on the request: for the limits that count (Enforced and
	// Shadow), State only when the store answered.
	Policy *Policy
	State  *LimitState
	// Held is what this process holds of a leased limit's counter, on a
	// store that leases (Redis): hits counted in the store and not yet
	// admitted, which it may admit without asking the store for HeldFor
	// more. 0 when it holds nothing.
	Held    uint64
	HeldFor time.Duration
	// Override is the runtime override in force on the limit (Limit then
	// has its values), nil when none is.
	Override *overrides.Override
}

// LimitState is a limit's counter for a descriptor, now.
type LimitState struct {
	Remaining uint64
	// Reset is the time until the window ends, the bucket is full or the
	// oldest logged hit leaves.
	Reset time.Duration
	// Admits says whether this limit admits the request's hits now (after
	// what the request's earlier limits on the same counter take, as a
	// decision judges them); Never that no wait would (more hits than it
	// can hold).
	Admits, Never bool
	// Blocked says that the limit's penalty blocks the counter: every
	// request is denied for BlockedFor.
	Blocked    bool
	BlockedFor time.Duration
}

// holder is what a store that leases implements (internal/lease): the
// slice it holds of a counter.
type holder interface {
	Held(desc string, rule *engine.Rule, now time.Time) (uint64, time.Duration)
}

// Explain says how req would be resolved and what its limits hold: the
// store judges it in a dry run (engine.Store.Peek) that consumes nothing.
// Observers are told nothing. It returns an *InvalidError for a malformed
// request; a store error is reported in the explanation.
func (s *Service) Explain(ctx context.Context, req *Request) (*Explanation, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	return s.explain(ctx, s.Config(), req), nil
}

// ExplainHTTP is Explain for a plain HTTP request against domain, whose
// descriptors come from the domain's http_descriptors (one hit each), as
// CheckHTTP makes them. For a domain the config does not have, it explains
// that.
func (s *Service) ExplainHTTP(ctx context.Context, domain string, r httpdesc.Request) (*Explanation, error) {
	cfg := s.Config()
	dom := cfg.Domain(domain)
	req := &Request{Domain: domain}
	var traces []httpdesc.Trace
	if dom != nil {
		traces = dom.HTTPDescriptors.Explain(r)
	}
	for _, tr := range traces {
		if tr.Entries != nil {
			req.Descriptors = append(req.Descriptors, Descriptor{Entries: tr.Entries})
		}
	}
	ex := s.explain(ctx, cfg, req)
	ex.HTTP = traces
	return ex, nil
}

// explain builds the explanation of a valid request against cfg (nil when
// none is loaded).
func (s *Service) explain(ctx context.Context, cfg *config.Config, req *Request) *Explanation {
	dom := cfg.Domain(req.Domain)
	ex := &Explanation{Domain: req.Domain, Config: cfg, Dom: dom, Code: OK, Descriptors: make([]DescriptorExplanation, len(req.Descriptors))}
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		ex.Descriptors[i] = DescriptorExplanation{Entries: d.Entries, Hits: req.hits(d), Refund: d.Refund, Override: d.Override != nil, Code: OK}
	}
	if dom == nil || len(req.Descriptors) == 0 {
		return ex
	}

	// The items a decision would make, by the same code, so that counters,
	// groups and shadows agree, judged by the store's dry run (Peek): the
	// verdicts are the engine's own, and nothing is consumed.
	sc := &scratch{table: s.overridesOf(cfg)}
	replaced, _ := sc.resolve(dom, req)
	sc.buildItems(req, newResponse(len(req.Descriptors)), replaced, s.all)
	results := make([]engine.Result, len(sc.items))
	if len(sc.items) > 0 {
		admitted, err := s.store.Peek(ctx, sc.items, results)
		switch {
		case err != nil:
			ex.StoreErr, results = err, nil
		case !admitted:
			ex.Code = OverLimit
			ex.Never = never(sc.items, results)
		}
	}

	replacers := replacersOf(sc.nodes)
	var now time.Time // read once, when a calendar limit needs it
	k := 0            // the next item
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		de := &ex.Descriptors[i]
		if d.Override == nil {
			de.Match = dom.Explain(d.Entries)
		}
		limits := d.limits(sc.nodes[i])
		de.Limits = make([]LimitExplanation, 0, len(limits))
		for _, l := range limits {
			le := LimitExplanation{Limit: l}
			if !l.Unlimited && l.Rule.InFlight() {
				le.LeaseTTL = l.Rule.Window
			}
			switch useOf(l, replaced) {
			case replacedUse:
				le.Applies, le.ReplacedBy = Replaced, replacers[l.Name]
			case unlimitedUse:
				le.Applies = Unlimited
			case enforcedUse:
				if s.all.shadowed(l) {
					le.Applies = Shadow
				}
				if d.Override == nil {
					le.Limit, le.Override = sc.table.Find(req.Domain, d.Entries, l)
				}
				// buildItems made the items of the enforced limits in
				// this order.
				s.explainState(&le, de, sc.items[k].Desc, results, k, &now)
				k++
			}
			de.Limits = append(de.Limits, le)
		}
	}
	return ex
}

// explainState sets the policy, the state (results[k], none when results
// is nil) and the slice held of le's limit, counted for descriptor de
// under desc, and de's code when the limit denies; now is read as policy
// reads it.
func (s *Service) explainState(le *LimitExplanation, de *DescriptorExplanation, desc string, results []engine.Result, k int, now *time.Time) {
	l := le.Limit
	reset := time.Duration(0)
	if l.Rule.Calendar != nil {
		reset = s.calendarLeft(l, now)
	}
	if results != nil {
		reset = results[k].Reset
	}
	p := s.policy(l, reset, now)
	le.Policy = &p
	if results != nil {
		r := &results[k]
		le.State = &LimitState{Remaining: r.Remaining, Reset: r.Reset, Admits: r.Admitted, Never: r.Never}
		if r.Blocked {
			le.State.Blocked, le.State.BlockedFor = true, r.RetryAfter
		}
		if !r.Admitted && le.Applies != Shadow {
			de.Code = OverLimit
		}
	}
	if h, ok := s.store.(holder); ok && l.Rule.Lease {
		if held, left := h.Held(desc, l.Rule, time.Now()); held > 0 {
			le.Held, le.HeldFor = held, left
		}
	}
}

// replacersOf returns, for each limit name that the limits of nodes
// replace, the labels of the limits that replace it.
func replacersOf(nodes []*config.Descriptor) map[string][]string {
	out := make(map[string][]string)
	for _, n := range nodes {
		if n == nil {
			continue
		}
		for _, l := range n.Limits {
			for _, name := range l.Replaces {
				out[name] = append(out[name], l.Label)
			}
		}
	}
	return out
}
