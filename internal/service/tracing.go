package service

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

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

// decideTraced is decide inside a SpanDecide span (s.tracer is set). A
// decision that the sampler leaves out (its caller did not sample its
// trace) makes no spans below, and spends nothing on their attributes.
func (s *Service) decideTraced(ctx context.Context, req *Request, headers HeaderMode) (*Response, error) {
	ctx, span := s.tracer.Start(ctx, SpanDecide)
	defer span.End()
	if !span.IsRecording() {
		return s.decideIn(ctx, req, headers, false)
	}
	span.SetAttributes(AttrDomain.String(req.Domain), AttrDescriptors.Int(len(req.Descriptors)))
	resp, err := s.decideIn(ctx, req, headers, true)
	if err != nil {
		failed(span, err)
		return nil, err
	}
	span.SetAttributes(AttrCode.String(resp.Code.String()))
	return resp, nil
}

// matchTraced is sc.resolve inside a SpanMatch span (s.tracer is set).
func (s *Service) matchTraced(ctx context.Context, sc *scratch, dom *config.Domain, req *Request) (map[string]bool, int) {
	_, span := s.tracer.Start(ctx, SpanMatch)
	defer span.End()
	replaced, unmatched := sc.resolve(dom, req)
	span.SetAttributes(AttrDescriptors.Int(len(req.Descriptors)), AttrUnmatched.Int(unmatched))
	return replaced, unmatched
}

// applyTraced is apply inside a SpanStore span (s.tracer is set): the
// store's own spans (a Redis round trip) are its children.
func (s *Service) applyTraced(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	ctx, span := s.tracer.Start(ctx, SpanStore, trace.WithAttributes(AttrStore.String(s.storeName), AttrItems.Int(len(items))))
	defer span.End()
	admitted, err := s.apply(ctx, items, results)
	if err != nil {
		failed(span, err)
		return false, err
	}
	span.SetAttributes(AttrAdmitted.Bool(admitted))
	return admitted, nil
}

// failed marks span as failed by err.
func failed(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
