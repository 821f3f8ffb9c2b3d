package compat

import (
	"maps"
	"strconv"
	"strings"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/service"
)

// Answers are envoyproxy/ratelimit's behaviours on whole answers, as its
// environment asks for them: a service.AnswerRule. The zero value changes
// nothing.
type Answers struct {
	// Shadow turns an OVER_LIMIT answer into OK (SHADOW_MODE=true); the
	// per-descriptor statuses keep their codes, and an answer it turns OK
	// carries no Retry-After. Counted in Stats's global_shadow_mode when
	// Stats is set.
	Shadow bool
	Stats  *Stats
	// DynamicMetadata sets the answer's dynamic metadata as the reference
	// does (RESPONSE_DYNAMIC_METADATA=true): the request's domain, its
	// descriptors and hits_addend, and under "metadata" the metadata of
	// every descriptor that passed, merged (referenceMetadata).
	DynamicMetadata bool
	// LimitHeaders, when not nil, adds the reference's three headers
	// (LIMIT_RESPONSE_HEADERS_ENABLED=true).
	LimitHeaders *LimitHeaderNames
}

var _ service.AnswerRule = (*Answers)(nil)

// LimitHeaderNames are the names of the reference's limit headers
// (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
type LimitHeaderNames struct {
	Limit, Remaining, Reset string
}

// DefaultLimitHeaderNames are the reference's defaults.
var DefaultLimitHeaderNames = LimitHeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}

// Finish implements service.AnswerRule: SHADOW_MODE, then the dynamic
// metadata and the limit headers of the answer it leaves.
func (r *Answers) Finish(a *service.Answer) {
	resp := a.Response
	if r.Shadow && resp.Code == service.OverLimit {
		resp.Code = service.OK
		a.RemoveHeader(service.HeaderRetryAfter)
		if r.Stats != nil {
			r.Stats.globalShadow.Inc()
		}
	}
	if r.DynamicMetadata {
		resp.Metadata = referenceMetadata(a)
	}
	if r.LimitHeaders != nil {
		resp.Headers = appendLimitHeaders(resp.Headers, r.LimitHeaders, a.Nodes, resp)
	}
}

// referenceMetadata is the reference's dynamic metadata of answer a:
// "domain", the request's; "descriptors", each descriptor's "entries" as
// "key=value" strings, its override as "limit" (the proto text form, which
// the reference prints with Go's String and so with spaces that vary
// between its builds; here with none) and its own "hitsAddend" when the
// request set one; "hitsAddend", the request's, when not 0; and under
// "metadata", when there is any, the metadata of the descriptors that
// passed: those OK under a limit of their node (not unlimited, replaced,
// overridden or unmatched), merged in order, a key's first value winning
// and maps merged key by key.
func referenceMetadata(a *service.Answer) map[string]any {
	out := make(map[string]any, 4)
	if req := a.Request; req != nil {
		out["domain"] = req.Domain
		ds := make([]any, len(req.Descriptors))
		for i := range req.Descriptors {
			ds[i] = descriptorMetadata(&req.Descriptors[i])
		}
		out["descriptors"] = ds
		if req.HitsAddend != 0 {
			out["hitsAddend"] = float64(req.HitsAddend)
		}
	}
	var passed map[string]any
	for i, n := range a.Nodes {
		st := &a.Response.Statuses[i]
		if n == nil || n.Metadata == nil || st.Code != service.OK || st.Limit == nil {
			continue
		}
		if passed == nil {
			passed = make(map[string]any, len(n.Metadata))
		}
		mergeMetadata(passed, n.Metadata)
	}
	if passed != nil {
		out["metadata"] = passed
	}
	return out
}

// descriptorMetadata is a request descriptor as the reference's dynamic
// metadata lists it.
func descriptorMetadata(d *service.Descriptor) map[string]any {
	m := make(map[string]any, 3)
	entries := make([]any, len(d.Entries))
	for i, e := range d.Entries {
		entries[i] = e.Key + "=" + e.Value
	}
	m["entries"] = entries
	if o := d.Override; o != nil {
		m["limit"] = overrideText(o)
	}
	if d.HasHits {
		m["hitsAddend"] = float64(d.Hits)
	}
	return m
}

// overrideText is a request's limit override in the proto text form:
// "requests_per_unit:10 unit:MINUTE", fields at their zero value left out.
func overrideText(o *service.Override) string {
	var b []byte
	sep := func() {
		if len(b) > 0 {
			b = append(b, ' ')
		}
	}
	if o.RequestsPerUnit != 0 {
		b = strconv.AppendUint(append(b, "requests_per_unit:"...), uint64(o.RequestsPerUnit), 10)
	}
	if o.Unit != engine.UnitUnknown {
		sep()
		b = append(append(b, "unit:"...), strings.ToUpper(o.Unit.String())...)
	}
	if o.UnitMultiplier != 0 {
		sep()
		b = append(strconv.AppendUint(append(b, "unit_multiplier:{value:"...), uint64(o.UnitMultiplier), 10), '}')
	}
	return string(b)
}

// mergeMetadata merges src into dst as the reference does: a key dst
// lacks takes src's value; a key both hold as maps is merged the same way,
// into a copy (the config's maps are shared); otherwise dst's value stays.
func mergeMetadata(dst, src map[string]any) {
	for k, v := range src {
		cur, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		cm, ok1 := cur.(map[string]any)
		sm, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			cm = maps.Clone(cm)
			mergeMetadata(cm, sm)
			dst[k] = cm
		}
	}
}

// appendLimitHeaders appends the reference's limit headers: of the status
// with the least remaining among those with a limit (the first on a tie),
// or, when a descriptor outside quota mode is over, of the last such
// status. Limit is requests_per_unit, Remaining limit_remaining, Reset the
// whole seconds until the status's reset. Nothing when no status has a
// limit.
func appendLimitHeaders(h []service.Header, names *LimitHeaderNames, nodes []*config.Descriptor, resp *service.Response) []service.Header {
	var chosen *service.Status
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.Limit == nil {
			continue
		}
		if chosen == nil || st.Remaining < chosen.Remaining {
			chosen = st
		}
	}
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.Code == service.OverLimit && st.Limit != nil && (i >= len(nodes) || nodes[i] == nil || !nodes[i].QuotaMode) {
			chosen = st
		}
	}
	if chosen == nil {
		return h
	}
	return append(h,
		service.Header{Key: names.Limit, Value: strconv.FormatUint(uint64(chosen.Limit.Rule.Limit), 10)},
		service.Header{Key: names.Remaining, Value: strconv.FormatUint(uint64(chosen.Remaining), 10)},
		service.Header{Key: names.Reset, Value: strconv.FormatInt(service.CeilSeconds(chosen.ResetAfter), 10)},
	)
}
