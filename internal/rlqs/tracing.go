package rlqs

import (
	"context"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tracing/spans"
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

// report is ss.Report, inside a SpanReport span when the server traces.
func (s *Server) report(ctx context.Context, ss *Session, r *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	ctx, span := spans.Start(ctx, s.opts.Tracer, SpanReport, trace.SpanKindServer)
	if span.Recording() {
		span.Set(AttrBuckets.Int(len(r.GetBucketQuotaUsages())))
	}
	resp, err := ss.Report(ctx, r)
	if span.Recording() {
		span.Set(service.AttrDomain.String(spans.Bound(ss.domainName())))
		if err == nil {
			span.Set(AttrActions.Int(len(resp.GetBucketAction())))
		}
	}
	span.End(err)
	return resp, err
}

// domainName is the stream's domain, "" before its first report.
func (ss *Session) domainName() string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.domain
}
