package service

import (
	"strconv"

	"github.com/rlsproject/rls/internal/config"
)

// Reference holds the behaviours of envoyproxy/ratelimit that rls offers
// where an operator asks for them (its compatibility mode sets them from
// the reference's environment; flags set them natively). The zero value
// is rls's own behaviour.
type Reference struct {
	// GlobalShadow turns an OVER_LIMIT answer into OK and counts it
	// (SHADOW_MODE=true); the per-descriptor statuses keep their codes.
	GlobalShadow bool
	// GlobalQuota treats every descriptor as a quota_mode one
	// (QUOTA_MODE=true): a request is denied only when all its descriptors
	// are over.
	GlobalQuota bool
	// LimitHeaders, when not nil, adds the reference's three headers
	// (LIMIT_RESPONSE_HEADERS_ENABLED=true) to RateLimitService answers.
	LimitHeaders *LimitHeaderNames
	// DynamicMetadata puts the metadata of every descriptor that passed in
	// the answer's dynamic metadata, first value winning on a conflict
	// (RESPONSE_DYNAMIC_METADATA=true).
	DynamicMetadata bool
	// Stats registers the reference's per-limit stats, as its Prometheus
	// mapping names them (refstats.go), when not nil.
	Stats *ReferenceStats
}

// LimitHeaderNames are the names of the reference's limit headers
// (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
type LimitHeaderNames struct {
	Limit, Remaining, Reset string
}

// DefaultLimitHeaderNames are the reference's defaults.
var DefaultLimitHeaderNames = LimitHeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}

// finishAnswer completes resp, a decided answer for a request whose
// descriptors matched nodes: the reference's SHADOW_MODE first (an answer
// it turns OK carries no Retry-After), then the headers of mode, then the
// reference's other answer-level behaviours.
func (s *Service) finishAnswer(nodes []*config.Descriptor, resp *Response, mode HeaderMode) {
	r := &s.ref
	if r.GlobalShadow && resp.Code == OverLimit {
		resp.Code = OK
		if s.refStats != nil {
			s.refStats.globalShadow.Inc()
		}
	}
	resp.Headers = appendHeaders(nil, mode, resp)
	if r.DynamicMetadata {
		resp.Metadata = passedMetadata(nodes, resp)
	}
	if r.LimitHeaders != nil {
		resp.Headers = appendLimitHeaders(resp.Headers, r.LimitHeaders, nodes, resp)
	}
}

// passedMetadata merges the metadata of the matched descriptors whose
// status is OK; the first value of a key wins. nil when there is none.
func passedMetadata(nodes []*config.Descriptor, resp *Response) map[string]any {
	var out map[string]any
	for i, n := range nodes {
		if n == nil || n.Metadata == nil || resp.Statuses[i].Code != OK {
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
func appendLimitHeaders(h []Header, names *LimitHeaderNames, nodes []*config.Descriptor, resp *Response) []Header {
	var chosen *Status
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
		if st.Code == OverLimit && st.Limit != nil && (i >= len(nodes) || nodes[i] == nil || !nodes[i].QuotaMode) {
			chosen = st
		}
	}
	if chosen == nil {
		return h
	}
	return append(h,
		Header{Key: names.Limit, Value: strconv.FormatUint(uint64(chosen.Limit.Rule.Limit), 10)},
		Header{Key: names.Remaining, Value: strconv.FormatUint(uint64(chosen.Remaining), 10)},
		Header{Key: names.Reset, Value: strconv.FormatInt(CeilSeconds(chosen.ResetAfter), 10)},
	)
}
