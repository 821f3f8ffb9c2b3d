package compat

import (
	"strconv"

	"github.com/rlsproject/rls/internal/config"
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
	// DynamicMetadata puts the metadata of every descriptor that passed in
	// the answer's dynamic metadata, first value winning on a conflict
	// (RESPONSE_DYNAMIC_METADATA=true).
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
		resp.Metadata = passedMetadata(a.Nodes, resp)
	}
	if r.LimitHeaders != nil {
		resp.Headers = appendLimitHeaders(resp.Headers, r.LimitHeaders, a.Nodes, resp)
	}
}

// passedMetadata merges the metadata of the matched descriptors whose
// status is OK; the first value of a key wins. nil when there is none.
func passedMetadata(nodes []*config.Descriptor, resp *service.Response) map[string]any {
	var out map[string]any
	for i, n := range nodes {
		if n == nil || n.Metadata == nil || resp.Statuses[i].Code != service.OK {
			continue
		}
		if out == nil {
			out = make(map[string]any, len(n.Metadata))
		}
		for k, v := range n.Metadata {
			if _, ok := out[k]; !ok {
				out[k] = v
			}
		}
	}
	return out
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
