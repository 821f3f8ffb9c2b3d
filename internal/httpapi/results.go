package httpapi

import (
	"fmt"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/service"
)

// The JSON of POST /debug/explain and POST /admin/reset: the service's
// plain results as the endpoints write them (and rls explain and rls reset
// read them). A field's name and form are part of the API.

// Explanation is the answer of POST /debug/explain in JSON
// (docs/explain.md): a service.Explanation as the endpoint writes it, and
// as rls explain reads it.
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
	// Reservation, when the domain has a reservation_key and its limits
	// reserve: the request's id, and this descriptor's reservations now
	// (those of its limit that holds the most).
	Reservation *DescriptorReservation `json:"reservation,omitempty"`
}

// DescriptorReservation is what a descriptor holds for reservations: the
// request's id (the value of the domain's reservation_key entry, "" for
// none: then this call neither reserves nor settles), the holds of its
// limits (Count, the most of any of its limits) and the age of the oldest
// (Go duration syntax; absent for none).
type DescriptorReservation struct {
	Key    string `json:"key"`
	ID     string `json:"id"`
	Count  uint32 `json:"count"`
	Oldest string `json:"oldest,omitempty"`
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
	// Reserve is the limit's reserve (reserve: {estimate, ttl}), absent for
	// a limit that does not reserve.
	Reserve *ReserveExplanation `json:"reserve,omitempty"`
	// Override is the runtime override in force on the limit
	// (/admin/overrides): requests_per_unit and burst above are its.
	Override *OverrideExplanation `json:"override,omitempty"`
}

// OverrideExplanation is a runtime override in force on a limit: the
// override as GET /admin/overrides writes it (its descriptor may hold
// prefixes), and what the config gives the limit.
type OverrideExplanation struct {
	overrides.JSON
	Configured ConfiguredLimit `json:"configured"`
}

// ConfiguredLimit is what the config gives a limit that an override
// replaces.
type ConfiguredLimit struct {
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Burst           uint32 `json:"burst,omitempty"`
}

// ReserveExplanation is a limit's reserve, and (with the state) what its
// counter holds for reservations now: Held hits (counted in the state's
// remaining) in Holds holds, the oldest OldestHold old (Go duration
// syntax; absent for none), and what this call would do: "reserve",
// "settle", "settled_again" (a second settle: nothing charged),
// "settle_unheld" (its hold ended by itself: its hits charged), or "none"
// (no id).
type ReserveExplanation struct {
	Estimate   uint32 `json:"estimate"`
	TTL        string `json:"ttl"`
	Call       string `json:"call,omitempty"`
	Held       uint64 `json:"held"`
	Holds      uint32 `json:"holds"`
	OldestHold string `json:"oldest_hold,omitempty"`
}

// SliceExplanation is this process's slice of a leased limit's counter:
// Held hits, counted in the store and not yet admitted, that it may admit
// without asking the store for ValidFor more (Go duration syntax). The
// state's remaining counts them.
type SliceExplanation struct {
	Held     uint64 `json:"held"`
	ValidFor string `json:"valid_for"`
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

// explanationJSON writes ex as POST /debug/explain answers it.
func explanationJSON(ex *service.Explanation) *Explanation {
	out := &Explanation{Domain: ex.Domain, KnownDomain: ex.Dom != nil, Code: ex.Code.String(), Never: ex.Never, Descriptors: make([]DescriptorExplanation, len(ex.Descriptors))}
	if ex.StoreErr != nil {
		out.StoreError, out.Code = ex.StoreErr.Error(), ""
	}
	out.HTTPDescriptors = make([]HTTPItemExplanation, len(ex.HTTP))
	made := 0 // descriptors made so far
	for i, tr := range ex.HTTP {
		it := &out.HTTPDescriptors[i]
		it.Index, it.At = tr.Index, fmt.Sprintf("%s:%d:%d", ex.Dom.File, tr.Line, tr.Column)
		if tr.Entries == nil {
			it.Dropped = &DroppedItem{Action: tr.Action, Kind: tr.ActionName, Reason: tr.Reason}
			continue
		}
		n := made
		it.Descriptor, it.Entries = &n, entriesJSON(tr.Entries)
		made++
	}
	for i := range ex.Descriptors {
		de, d := &ex.Descriptors[i], &out.Descriptors[i]
		d.Entries, d.Hits, d.Refund, d.Code = entriesJSON(de.Entries), de.Hits, de.Refund, de.Code.String()
		switch {
		case ex.Dom == nil:
			d.Match = Match{Result: config.UnknownDomain.String(), Message: unknownDomainMessage(ex.Config, ex.Domain)}
		case de.Override:
			d.Match = Match{Result: "override", Message: "the request's limit override applies; the config is not consulted"}
		default:
			d.Match = explainMatch(ex.Dom, de.Matched, de.Match)
			if n := de.Match.Node; n != nil {
				d.QuotaMode = n.QuotaMode
			}
		}
		if ex.Dom != nil && ex.StoreErr != nil {
			d.Code = "" // unknown without the state
		}
		d.Limits = make([]LimitExplanation, len(de.Limits))
		for j := range de.Limits {
			d.Limits[j] = limitJSON(ex.Dom, &de.Limits[j])
			if o := de.Limits[j].Override; o != nil {
				configured := ex.Config.Limits()[de.Limits[j].Limit.Index].Rule
				d.Limits[j].Override = &OverrideExplanation{JSON: o.ToJSON(), Configured: ConfiguredLimit{RequestsPerUnit: configured.Limit, Burst: configured.Burst}}
			}
		}
		d.Reservation = descriptorReservation(ex.Dom, de)
	}
	return out
}

// descriptorReservation is what descriptor de of domain dom holds for
// reservations, nil when none of its limits reserves.
func descriptorReservation(dom *config.Domain, de *service.DescriptorExplanation) *DescriptorReservation {
	var out *DescriptorReservation
	var oldest time.Duration
	for j := range de.Limits {
		le := &de.Limits[j]
		if le.Limit.Unlimited || le.Limit.Rule.Reserve == nil {
			continue
		}
		if out == nil {
			out = &DescriptorReservation{Key: dom.ReservationKey, ID: de.Reservation}
		}
		if s := le.State; s != nil {
			out.Count, oldest = max(out.Count, s.Holds), max(oldest, s.OldestHold)
		}
	}
	if out != nil && oldest > 0 {
		out.Oldest = oldest.String()
	}
	return out
}

// limitJSON writes le, a limit of domain dom.
func limitJSON(dom *config.Domain, le *service.LimitExplanation) LimitExplanation {
	l := explainLimit(dom, le.Limit)
	l.Applies, l.ReplacedBy = le.Applies.String(), le.ReplacedBy
	if le.LeaseTTL > 0 {
		l.LeaseTTL = le.LeaseTTL.String()
	}
	if p := le.Policy; p != nil {
		l.Policy = &PolicyExplanation{Quota: p.Quota, WindowSeconds: int64(p.Window / time.Second)}
	}
	if s := le.State; s != nil {
		l.State = &LimitState{Remaining: s.Remaining, Reset: s.Reset.String(), Admits: s.Admits, Never: s.Never}
		if s.Blocked {
			l.State.BlockedFor = s.BlockedFor.String()
		}
	}
	if le.Held > 0 {
		l.Slice = &SliceExplanation{Held: le.Held, ValidFor: le.HeldFor.String()}
	}
	if l.Reserve != nil {
		if s := le.State; s != nil {
			l.Reserve.Call, l.Reserve.Held, l.Reserve.Holds = s.Phase.String(), s.Held, s.Holds
			if s.OldestHold > 0 {
				l.Reserve.OldestHold = s.OldestHold.String()
			}
		}
	}
	return l
}

// explainLimit writes l, of domain dom, without what a request does with
// it.
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
		if res := r.Reserve; res != nil {
			le.Reserve = &ReserveExplanation{Estimate: res.Estimate, TTL: res.TTL.String()}
		}
		for _, d := range r.Penalty {
			le.Penalty = append(le.Penalty, d.String())
		}
		if r.Penalized() {
			le.PenaltyReset = r.PenaltyReset.String()
		}
	}
	return le
}

// explainMatch writes tr, the trace of entries in dom, as a Match.
func explainMatch(dom *config.Domain, entries []config.Entry, tr config.Trace) Match {
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
	if tr.Stop == config.NoEntries {
		// A request's descriptor has entries: none are left when its one
		// entry was the domain's reservation_key, which is never matched.
		m.Message = fmt.Sprintf("no entries to match: the descriptor's one entry is %q, the domain's reservation_key (a request's id), which is never matched", dom.ReservationKey)
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

// entriesJSON writes descriptor entries.
func entriesJSON(es []config.Entry) []EntryJSON {
	out := make([]EntryJSON, len(es))
	for i, e := range es {
		out[i] = EntryJSON{Key: e.Key, Value: e.Value}
	}
	return out
}

// ResetResult is the answer of POST /admin/reset in JSON: a
// service.ResetResult as the endpoint writes it, and as rls reset reads
// it.
type ResetResult struct {
	Domain      string            `json:"domain"`
	Descriptors []ResetDescriptor `json:"descriptors"`
	// Cleared is the number of counters that held state and were cleared
	// (a counter never used, or whose window ended, holds none).
	Cleared int `json:"cleared"`
}

// ResetDescriptor is what a reset did to one descriptor of the request.
type ResetDescriptor struct {
	Entries []EntryJSON `json:"entries"`
	// Limits are the labels of the limits whose counters were reset, in
	// the config's order; empty when the descriptor matched no limit.
	Limits []string `json:"limits"`
}

// String writes the descriptor key=value,... as rls check takes it.
func (d ResetDescriptor) String() string {
	parts := make([]string, len(d.Entries))
	for i, e := range d.Entries {
		parts[i] = e.Key + "=" + e.Value
	}
	return strings.Join(parts, ",")
}

// resetJSON writes res as POST /admin/reset answers it.
func resetJSON(res *service.ResetResult) *ResetResult {
	out := &ResetResult{Domain: res.Domain, Descriptors: make([]ResetDescriptor, len(res.Descriptors)), Cleared: res.Cleared}
	for i, d := range res.Descriptors {
		out.Descriptors[i] = ResetDescriptor{Entries: entriesJSON(d.Entries), Limits: make([]string, len(d.Limits))}
		for j, l := range d.Limits {
			out.Descriptors[i].Limits[j] = l.Label
		}
	}
	return out
}
