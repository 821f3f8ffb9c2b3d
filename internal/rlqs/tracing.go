package rlqs

import (
	"context"
	"unicode/utf8"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/rlsproject/rls/internal/service"
)

// SpanReport is the span of one usage report of a stream, with
// Options.Tracer (README "Tracing"): a server span, child of the trace
// context of the stream's metadata, parent of the rls.decide spans of the
// charges and grants the report leads to. Its attributes: rls.domain (the
// stream's), rls.rlqs.buckets (the buckets reported), rls.rlqs.actions
// (the actions answered); a report that ends the stream has the error
// status.
const SpanReport = "rls.rlqs.report"

// The attribute keys of SpanReport beside service.AttrDomain.
const (
	AttrBuckets = attribute.Key("rls.rlqs.buckets")
	AttrActions = attribute.Key("rls.rlqs.actions")
)

// reportTraced is ss.Report inside a SpanReport span (s.opts.Tracer is
// set).
func (s *Server) reportTraced(ctx context.Context, ss *Session, r *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	ctx, span := s.opts.Tracer.Start(ctx, SpanReport, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(AttrBuckets.Int(len(r.GetBucketQuotaUsages()))))
	defer span.End()
	resp, err := ss.Report(ctx, r)
	span.SetAttributes(service.AttrDomain.String(bounded(ss.domainName())))
	if err != nil {
		msg := bounded(err.Error())
		span.AddEvent("exception", trace.WithAttributes(attribute.String("exception.message", msg)))
		span.SetStatus(codes.Error, msg)
		return nil, err
	}
	span.SetAttributes(AttrActions.Int(len(resp.GetBucketAction())))
	return resp, nil
}

// domainName is the stream's domain, "" before its first report.
func (ss *Session) domainName() string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.domain
}

// maxAttr bounds a string put in a span: what a client sends may be long
// (a stream's domain is checked after its report is traced).
const maxAttr = 256

// bounded is s cut to maxAttr bytes, on a UTF-8 boundary, with "…" when
// cut.
func bounded(s string) string {
	if len(s) <= maxAttr {
		return s
	}
	cut := maxAttr - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
