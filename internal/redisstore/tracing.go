package redisstore

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
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

// cacheHit marks the caller's span as answered by the denial cache.
func (s *Store) cacheHit(ctx context.Context) {
	if s.opts.Tracer != nil && trace.SpanFromContext(ctx).IsRecording() {
		trace.SpanFromContext(ctx).SetAttributes(AttrDenyCacheHit.Bool(true))
	}
}
