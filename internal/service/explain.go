package service

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/httpdesc"
)

// Explanation says how the service would resolve a request and what its
// limits hold now, found without consuming anything (POST /debug/explain).
// Its JSON form is the endpoint's answer (docs/explain.md). A value, built
// per call.
type Explanation struct {
	Domain string `json:"domain"`
	// KnownDomain is false when the config has no such domain: every
	// descriptor is then answered OK with no limit.
	KnownDomain bool `json:"known_domain"`
	// Code is what the request would get if it came now: OK or OVER_LIMIT,
	// as the store judges it in a dry run (engine.Store.Peek).
	Code string `json:"code"`
	// Never: the request can never pass as it is (more hits than a limit
	// or a bucket admits).
	Never bool `json:"never,omitempty"`
	// HTTPDescriptors, for an HTTP request, say what each item of the
	// domain's http_descriptors made of it.
	HTTPDescriptors []HTTPItemExplanation   `json:"http_descriptors,omitempty"`
	Descriptors     []DescriptorExplanation `json:"descriptors"`
	// StoreError is set when the limits' state could not be read; the
	// limits are then listed without state, and Code is "".
	StoreError string `json:"store_error,omitempty"`
}

// HTTPItemExplanation is one item of http_descriptors applied to a request.
type HTTPItemExplanation struct {
	Index int    `json:"index"`
	At    string `json:"at"` // file:line:col
	// Descriptor is the index in Descriptors of what the item made; absent
	// when it made nothing.
	Descriptor *int         `json:"descriptor,omitempty"`
	Entries    []EntryJSON  `json:"entries,omitempty"`
	Dropped    *DroppedItem `json:"dropped,omitempty"`
}

// DroppedItem says which action of an http_descriptors item made no entry.
type DroppedItem struct {
	Action int    `json:"action"` // -1: every action was skipped
	Kind   string `json:"kind,omitempty"`
	Reason string `json:"reason"`
}

// EntryJSON is a descriptor entry.
type EntryJSON struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// DescriptorExplanation is one request descriptor: what it matched and
// its limits.
type DescriptorExplanation struct {
	Entries []EntryJSON `json:"entries"`
	// Hits are the hits the request would take (0: only a look); Refund
	// gives them back.
	Hits   uint64 `json:"hits"`
	Refund bool   `json:"refund,omitempty"`
	Match  Match  `json:"match"`
	// QuotaMode: the matched node is in quota_mode.
	QuotaMode bool `json:"quota_mode,omitempty"`
	// Limits are the limits of the matched node (or the override), each
	// with what the request does with it.
	Limits []LimitExplanation `json:"limits"`
	// Code is this descriptor's status if the request came now.
	Code string `json:"code,omitempty"`
}

// Match is how a descriptor's entries met the config.
type Match struct {
	// Result: "matched" (a node with limits), "no_limits" (a node without
	// any), "override" (the request's own limit; the config is not
	// consulted), or where matching stopped: "unknown_domain",
	// "no_node_for_key", "value_not_matched", "deeper_than_config".
	Result string `json:"result"`
	// Node is the config path of the node reached, At its file:line:col.
	Node string `json:"node,omitempty"`
	At   string `json:"at,omitempty"`
	// Steps are the levels matched: entry, node path and how ("exact",
	// "wildcard", "any_value").
	Steps []MatchStep `json:"steps,omitempty"`
	// Where matching stopped: the index of the entry, the path of the node
	// under which nothing matched it ("" at the top level), and what that
	// level has: its keys (no_node_for_key) or the values of the entry's
	// key (value_not_matched), at most config.MaxCandidates, More
	// counting the rest.
	StoppedAt *int     `json:"stopped_at_entry,omitempty"`
	Under     string   `json:"under,omitempty"`
	KeysThere []string `json:"keys_there,omitempty"`
	Values    []string `json:"values_there,omitempty"`
	More      int      `json:"more,omitempty"`
	// Message says it in a sentence.
	Message string `json:"message"`
}

// MatchStep is one matched level.
type MatchStep struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	Node  string `json:"node"`
	How   string `json:"how"`
}

// LimitExplanation is one limit of a descriptor.
type LimitExplanation struct {
	Label           string `json:"label"`
	Name            string `json:"name,omitempty"`
	At              string `json:"at,omitempty"` // file:line:col; absent for an override
	Unlimited       bool   `json:"unlimited,omitempty"`
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit,omitempty"`
	UnitMultiplier  uint32 `json:"unit_multiplier,omitempty"`
	Window          string `json:"window,omitempty"`
	Algorithm       string `json:"algorithm,omitempty"`
	Burst           uint32 `json:"burst,omitempty"`
	// Penalty is the ladder of blocks the limit's denials earn, and
	// PenaltyReset the quiet time after which it starts over (Go duration
	// syntax).
	Penalty      []string `json:"penalty,omitempty"`
	PenaltyReset string   `json:"penalty_reset,omitempty"`
	// LeaseTTL is a concurrency limit's lease_ttl (Go duration syntax); its
	// Window is the same, and its unit means nothing.
	LeaseTTL string `json:"lease_ttl,omitempty"`
	// Applies: "enforced", "shadow" (counted, never denies), "unlimited"
	// (the descriptor is not counted), "replaced" (ReplacedBy names the
	// limits of this request whose replaces drop it).
	Applies    string   `json:"applies"`
	ReplacedBy []string `json:"replaced_by,omitempty"`
	// Policy is how answers advertise this limit (X-RateLimit-Limit,
	// RateLimit-Policy; see service.Policy), for the limits that count
	// (enforced and shadow; headers never show a shadow one).
	Policy *PolicyExplanation `json:"policy,omitempty"`
	// State is the counter now, and this limit's verdict on the request,
	// for the limits that count (enforced and shadow).
	State *LimitState `json:"state,omitempty"`
	// Lease: the limit is leased (lease: true). Slice is what this process
	// holds of the counter, on a store that leases (Redis); absent when it
	// holds nothing.
	Lease bool              `json:"lease,omitempty"`
	Slice *SliceExplanation `json:"slice,omitempty"`
}

// SliceExplanation is this process's slice of a leased limit's counter:
// Held hits, counted in the store and not yet admitted, that it may admit
// without asking the store for ValidFor more (Go duration syntax). The
// state's remaining counts them.
type SliceExplanation struct {
	Held     uint64 `json:"held"`
	ValidFor string `json:"valid_for"`
}

// holder is what a store that leases implements (internal/lease): the
// slice it holds of a counter.
type holder interface {
	Held(desc string, rule *engine.Rule, now time.Time) (uint64, time.Duration)
}

// PolicyExplanation is a limit's advertised policy: Quota hits per
// WindowSeconds. It differs from requests_per_unit per window for a token
// bucket whose burst is not its rate (the burst per the time an empty
// bucket takes to fill) and for a calendar window (the length of the
// calendar window holding now).
type PolicyExplanation struct {
	Quota         uint32 `json:"quota"`
	WindowSeconds int64  `json:"window_seconds"`
}

// LimitState is a limit's counter for a descriptor, now.
type LimitState struct {
	Remaining uint64 `json:"remaining"`
	// Reset is the time until the window ends, the bucket is full or the
	// oldest logged hit leaves (Go duration syntax).
	Reset string `json:"reset"`
	// Admits says whether this limit admits the request's hits now (after
	// what the request's earlier limits on the same counter take, as a
	// decision judges them); Never that no wait would (more hits than it
	// can hold).
	Admits bool `json:"admits"`
	Never  bool `json:"never,omitempty"`
	// BlockedFor, for a limit with a penalty whose counter is blocked, is
	// the time until it may admit again (Go duration syntax): every
	// request is denied until then.
	BlockedFor string `json:"blocked_for,omitempty"`
}

// Explain says how req would be resolved and what its limits hold: the
// store judges it in a dry run (engine.Store.Peek) that consumes nothing.
// Nothing is counted in metrics. It returns an *InvalidError for a
// malformed request; a store error is reported in the explanation.
func (s *Service) Explain(ctx context.Context, req *Request) (*Explanation, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	cur := s.current.Load()
	var cfg *config.Config
	if cur != nil {
		cfg = cur.cfg
	}
	return s.explain(ctx, cfg, req), nil
}

// ExplainHTTP is Explain for a plain HTTP request against domain, whose
// descriptors come from the domain's http_descriptors (one hit each), as
// CheckHTTP makes them. For a domain the config does not have, it explains
// that.
func (s *Service) ExplainHTTP(ctx context.Context, domain string, r httpdesc.Request) (*Explanation, error) {
	cur := s.current.Load()
	var cfg *config.Config
	if cur != nil {
		cfg = cur.cfg
	}
	dom := cfg.Domain(domain)
	req := &Request{Domain: domain}
	var traces []httpdesc.Trace
	if dom != nil {
		traces = dom.HTTPDescriptors.Explain(r)
	}
	items := make([]HTTPItemExplanation, len(traces))
	for i, tr := range traces {
		it := &items[i]
		it.Index, it.At = tr.Index, fmt.Sprintf("%s:%d:%d", dom.File, tr.Line, tr.Column)
		if tr.Entries == nil {
			it.Dropped = &DroppedItem{Action: tr.Action, Kind: tr.ActionName, Reason: tr.Reason}
			continue
		}
		n := len(req.Descriptors)
		it.Descriptor, it.Entries = &n, entriesJSON(tr.Entries)
		req.Descriptors = append(req.Descriptors, Descriptor{Entries: tr.Entries})
	}
	ex := s.explain(ctx, cfg, req)
	ex.HTTPDescriptors = items
	return ex, nil
}

// explain builds the explanation of a valid request against cfg (nil when
// none is loaded).
func (s *Service) explain(ctx context.Context, cfg *config.Config, req *Request) *Explanation {
	dom := cfg.Domain(req.Domain)
	ex := &Explanation{Domain: req.Domain, KnownDomain: dom != nil, Code: OK.String(), Descriptors: make([]DescriptorExplanation, len(req.Descriptors))}
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		de := &ex.Descriptors[i]
		de.Entries, de.Hits, de.Refund = entriesJSON(d.Entries), req.hits(d), d.Refund
		de.Code = OK.String()
		if dom == nil {
			de.Match = Match{Result: config.UnknownDomain.String(), Message: unknownDomainMessage(cfg, req.Domain)}
			de.Limits = []LimitExplanation{}
		}
	}
	if dom == nil || len(req.Descriptors) == 0 {
		return ex
	}

	// The items a decision would make, by the same code, so that counters,
	// groups and shadows agree, judged by the store's dry run (Peek): the
	// verdicts are the engine's own, and nothing is consumed.
	sc := new(scratch)
	replaced, _ := sc.resolve(dom, req)
	resp := newResponse(len(req.Descriptors))
	sc.buildItems(req, resp, replaced, s.all)
	results := make([]engine.Result, len(sc.items))
	if len(sc.items) > 0 {
		admitted, err := s.store.Peek(ctx, sc.items, results)
		switch {
		case err != nil:
			ex.StoreError, ex.Code = err.Error(), ""
			results = nil
		case !admitted:
			ex.Code = OverLimit.String()
			ex.Never = never(sc.items, results)
		}
	}

	replacers := replacersOf(sc.nodes)
	var now time.Time // read once, when a calendar limit needs it
	k := 0            // the next item
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		de := &ex.Descriptors[i]
		node := sc.nodes[i]
		if results == nil {
			de.Code = "" // unknown without the state
		}
		if d.Override != nil {
			de.Match = Match{Result: "override", Message: "the request's limit override applies; the config is not consulted"}
		} else {
			de.Match = explainMatch(dom, d.Entries)
			if node != nil {
				de.QuotaMode = node.QuotaMode
			}
		}
		limits := d.limits(node)
		de.Limits = make([]LimitExplanation, 0, len(limits))
		for _, l := range limits {
			le := explainLimit(dom, l)
			switch useOf(l, replaced) {
			case replacedUse:
				le.Applies, le.ReplacedBy = "replaced", replacers[l.Name]
			case unlimitedUse:
				le.Applies = "unlimited"
			case enforcedUse:
				if s.all.shadowed(l) {
					le.Applies = "shadow"
				}
				// buildItems made the items of the enforced limits in
				// this order.
				reset := time.Duration(0)
				if l.Rule.Calendar != nil {
					reset = s.calendarLeft(l, &now)
				}
				if results != nil {
					reset = results[k].Reset
				}
				p := s.policy(l, reset, &now)
				le.Policy = &PolicyExplanation{Quota: p.Quota, WindowSeconds: int64(p.Window / time.Second)}
				if results != nil {
					r := &results[k]
					le.State = &LimitState{Remaining: r.Remaining, Reset: r.Reset.String(), Admits: r.Admitted, Never: r.Never}
					if r.Blocked {
						le.State.BlockedFor = r.RetryAfter.String()
					}
					if !r.Admitted && !s.all.shadowed(l) {
						de.Code = OverLimit.String()
					}
				}
				if h, ok := s.store.(holder); ok && l.Rule.Lease {
					if held, left := h.Held(sc.items[k].Desc, l.Rule, time.Now()); held > 0 {
						le.Slice = &SliceExplanation{Held: held, ValidFor: left.String()}
					}
				}
				k++
			}
			de.Limits = append(de.Limits, le)
		}
	}
	return ex
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

func explainLimit(dom *config.Domain, l *config.Limit) LimitExplanation {
	le := LimitExplanation{Label: l.Label, Name: l.Name, Unlimited: l.Unlimited, Applies: "enforced"}
	if l.Line > 0 {
		le.At = fmt.Sprintf("%s:%d:%d", dom.File, l.Line, l.Column)
	}
	if !l.Unlimited {
		r := l.Rule
		le.RequestsPerUnit, le.Unit, le.UnitMultiplier = r.Limit, r.Unit.String(), r.Multiplier
		le.Window, le.Algorithm, le.Burst = r.Window.String(), r.Algorithm(), r.Burst
		le.Lease = r.Lease
		for _, d := range r.Penalty {
			le.Penalty = append(le.Penalty, d.String())
		}
		if r.Penalized() {
			le.PenaltyReset = r.PenaltyReset.String()
		}
		if r.InFlight() {
			le.LeaseTTL = r.Window.String()
		}
	}
	return le
}

// explainMatch turns the trace of entries in dom into a Match.
func explainMatch(dom *config.Domain, entries []config.Entry) Match {
	tr := dom.Explain(entries)
	m := Match{Result: tr.Stop.String()}
	for _, s := range tr.Steps {
		m.Steps = append(m.Steps, MatchStep{Key: s.Entry.Key, Value: s.Entry.Value, Node: s.Node.Path, How: s.How.String()})
	}
	if tr.Stop == config.Matched {
		n := tr.Node
		m.Node, m.At = n.Path, fmt.Sprintf("%s:%d:%d", dom.File, n.Line, n.Column)
		m.Message = fmt.Sprintf("matched %q (%s)", n.Path, m.At)
		if len(n.Limits) == 0 {
			m.Result = "no_limits"
			m.Message = fmt.Sprintf("matched %q (%s), which has no limits", n.Path, m.At)
			if len(n.Children) > 0 {
				m.Message += ": its nested descriptors do, and the request's descriptor ends here"
			}
		}
		return m
	}
	at := tr.At
	m.StoppedAt = &at
	e := entries[at]
	where := "at the top level"
	if tr.Parent != nil {
		m.Under = tr.Parent.Path
		where = fmt.Sprintf("under %q", tr.Parent.Path)
	}
	more := ""
	if tr.More > 0 {
		more = fmt.Sprintf(" and %d more", tr.More)
	}
	entry := fmt.Sprintf("entries[%d] (%s=%s)", at, e.Key, e.Value)
	switch tr.Stop {
	case config.NoNodeForKey:
		m.KeysThere, m.More = tr.Keys, tr.More
		if len(tr.Keys) == 0 {
			m.Message = fmt.Sprintf("%s: no descriptor has key %q %s: there are none", entry, e.Key, where)
		} else {
			m.Message = fmt.Sprintf("%s: no descriptor has key %q %s (keys there: %s%s)", entry, e.Key, where, strings.Join(tr.Keys, ", "), more)
		}
	case config.ValueNotMatched:
		for _, c := range tr.Candidates {
			m.Values = append(m.Values, c.Value)
		}
		m.More = tr.More
		m.Message = fmt.Sprintf("%s: no value of key %q %s is %q or a wildcard matching it, and the key has no value-less descriptor (values there: %s%s)",
			entry, e.Key, where, e.Value, strings.Join(m.Values, ", "), more)
	case config.DeeperThanConfig:
		m.Message = fmt.Sprintf("%s: %q has no nested descriptors: the request's descriptor has more entries than the config is deep there", entry, tr.Parent.Path)
	}
	return m
}

// unknownDomainMessage says that cfg has no domain called name, and which
// it has.
func unknownDomainMessage(cfg *config.Config, name string) string {
	if cfg == nil {
		return "no config is loaded"
	}
	var names []string
	for i, d := range cfg.Domains() {
		if i == config.MaxCandidates {
			names = append(names, "…")
			break
		}
		names = append(names, d.Name)
	}
	return fmt.Sprintf("domain %q is not in the config (domains: %s): requests for it are answered OK with no limit", name, strings.Join(names, ", "))
}

func entriesJSON(es []config.Entry) []EntryJSON {
	out := make([]EntryJSON, len(es))
	for i, e := range es {
		out[i] = EntryJSON{Key: e.Key, Value: e.Value}
	}
	return out
}
