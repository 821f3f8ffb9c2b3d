package redisstore

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/rlsproject/rls/internal/engine"
)

// The store's spans, with Options.Tracer (README "Tracing"): names and
// attribute keys are stable.
const (
	// SpanRedis is one request's trip to one Redis node: from the
	// pipeline's queue to the decide function's reply (a request on several
	// nodes has one per node). Its attributes: db.system.name "redis",
	// db.operation.name "FCALL", server.address (a cluster node's; none on
	// a single Redis), rls.redis.mode (final, reserve, charge, peek),
	// rls.items; its event rls.redis.sent marks when its pipeline left,
	// with rls.redis.pipeline_requests, the requests of that pipeline to
	// that node. A failed trip has the error status and the error.
	SpanRedis = "rls.redis"
	// EventSent is SpanRedis's event when the request's pipeline is sent.
	EventSent = "rls.redis.sent"
)

// The attribute keys of the store's spans.
const (
	AttrDBSystem      = attribute.Key("db.system.name")
	AttrDBOperation   = attribute.Key("db.operation.name")
	AttrServerAddress = attribute.Key("server.address")
	AttrMode          = attribute.Key("rls.redis.mode")
	AttrItems         = attribute.Key("rls.items")
	AttrPipeline      = attribute.Key("rls.redis.pipeline_requests")
	// AttrDenyCacheHit is set (true) on the caller's span (the service's
	// rls.store) when the denial cache answered: no trip to Redis.
	AttrDenyCacheHit = attribute.Key("rls.redis.deny_cache_hit")
)

// modeNames name the request modes in spans.
var modeNames = map[string]string{modeFinal: "final", modeReserve: "reserve", modeCharge: "charge", modePeek: "peek"}

// traced reports whether a call with ctx makes spans: the store traces and
// its caller's span is recorded. (A call that no recorded span led to, a
// debug explanation, a sampled-out request, makes none: no orphan roots.)
func (s *Store) traced(ctx context.Context) bool {
	return s.opts.Tracer != nil && trace.SpanFromContext(ctx).IsRecording()
}

// sendTraced is sendRequest inside a SpanRedis span, marked when its
// pipeline leaves.
func (s *Store) sendTraced(ctx context.Context, b *backend, node string, req *request, results []engine.Result, out *reply) (bool, error) {
	attrs := []attribute.KeyValue{AttrDBSystem.String("redis"), AttrDBOperation.String("FCALL"),
		AttrMode.String(modeNames[req.mode]), AttrItems.Int(len(req.items))}
	if node != "" {
		attrs = append(attrs, AttrServerAddress.String(node))
	}
	ctx, span := s.opts.Tracer.Start(ctx, SpanRedis, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	admitted, err := s.trip(ctx, b, node, req, results, out, func(at time.Time, pipeline int) {
		span.AddEvent(EventSent, trace.WithTimestamp(at), trace.WithAttributes(AttrPipeline.Int(pipeline)))
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return admitted, err
}

// cacheHit marks the caller's span as answered by the denial cache.
func (s *Store) cacheHit(ctx context.Context) {
	if s.traced(ctx) {
		trace.SpanFromContext(ctx).SetAttributes(AttrDenyCacheHit.Bool(true))
	}
}
