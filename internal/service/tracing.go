package service

import "go.opentelemetry.io/otel/attribute"

// The spans of a decision, with Options.Tracer (README "Tracing"): their
// names and attribute keys are stable. Without a tracer the service makes
// none and spends nothing on them.
const (
	// SpanDecide is one decision: a RateLimitService request, an ext_authz
	// or /auth check that reached the service with descriptors, an RLQS
	// charge. Its attributes: rls.domain, rls.descriptors, and once
	// decided rls.code (OK or OVER_LIMIT); a failed decision has the error
	// status and the error as an event.
	SpanDecide = "rls.decide"
	// SpanMatch is the matching of the request's descriptors against the
	// domain's tree: rls.descriptors, rls.unmatched (those that reached no
	// node with limits).
	SpanMatch = "rls.match"
	// SpanStore is the store call that judges the request's limits:
	// rls.store (memory or redis), rls.items (the limits judged), and
	// once answered rls.admitted; a failed call has the error status and
	// the error.
	SpanStore = "rls.store"
)

// The attribute keys of the service's spans.
const (
	AttrDomain      = attribute.Key("rls.domain")
	AttrDescriptors = attribute.Key("rls.descriptors")
	AttrCode        = attribute.Key("rls.code")
	AttrUnmatched   = attribute.Key("rls.unmatched")
	AttrStore       = attribute.Key("rls.store")
	AttrItems       = attribute.Key("rls.items")
	AttrAdmitted    = attribute.Key("rls.admitted")
)
