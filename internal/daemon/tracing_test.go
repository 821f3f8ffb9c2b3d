package daemon

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/metadata"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/tracing/otlptest"
)

// tracedLimits has limits for every transport: descriptors for RLS and
// RLQS, http_descriptors for /auth and ext_authz.
const tracedLimits = `domain: d
http_descriptors:
  - actions: [{generic_key: {descriptor_value: all, descriptor_key: k}}]
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// callerTrace is the trace context of a caller (Envoy, nginx) that asks
// rls: its trace id, and its span's id, the parent of rls's server span.
type callerTrace struct{ traceID, spanID string }

func (c callerTrace) traceparent() string { return "00-" + c.traceID + "-" + c.spanID + "-01" }

// newCaller returns the n-th caller's trace context.
func newCaller(n int) callerTrace {
	return callerTrace{traceID: fmt.Sprintf("%032x", 0xa0000+n), spanID: fmt.Sprintf("%016x", 0xb00+n)}
}

// TestTracing: with an OTLP endpoint, each decision on each transport is a
// server span that continues its caller's trace (gRPC metadata, HTTP
// headers), over rls.decide, rls.match and rls.store (and rls.redis on
// Redis), with the documented attributes; requests that decide nothing
// make no spans; the spans are sent by the time Run returns.
func TestTracing(t *testing.T) {
	for _, kind := range []StoreKind{Memory, Redis} {
		t.Run(string(kind), func(t *testing.T) {
			recv := otlptest.Start(t)
			path := filepath.Join(t.TempDir(), "limits.yaml")
			writeFile(t, path, tracedLimits)
			cfg := testConfig(path)
			cfg.Tracing.Endpoint = recv.GRPCAddr() // loopback: plain text
			cfg.Tracing.ServiceName = "rls-test"
			if kind == Redis {
				cfg.Store.Kind, cfg.Store.Redis.URL = Redis, redistest.Start(t).URL()
				cfg.Store.Redis.Timeout = time.Second // a starved test machine
			}
			r := start(t, cfg)
			if r.tracing == nil {
				t.Fatal("no tracing provider with an endpoint")
			}
			callers := decideOnEveryTransport(t, r)
			// Not decisions: no spans.
			for _, path := range []string{"/healthz", "/metrics", "/readyz"} {
				req, _ := http.NewRequest("GET", "http://"+r.httpAddr+path, nil)
				req.Header.Set("traceparent", newCaller(99).traceparent())
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}
			if err := r.stop(); err != nil { // flushes
				t.Fatal(err)
			}
			spans := recv.Spans()
			checkTraces(t, spans, callers, string(kind))
			if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
				t.Error("the process-wide tracer provider is rls's: rls must set no global state")
			}
			for _, s := range spans {
				if s.TraceID == newCaller(99).traceID {
					t.Errorf("a request that decides nothing made a span: %v", s)
				}
				if s.Resource["service.name"] != "rls-test" {
					t.Errorf("%v: resource %v, want service.name rls-test", s, s.Resource)
				}
			}
		})
	}
}

// decideOnEveryTransport sends one decision on each transport, each in the
// trace of its own caller, and returns the callers by server span name.
func decideOnEveryTransport(t *testing.T, r *running) map[string]callerTrace {
	t.Helper()
	callers := map[string]callerTrace{}
	outgoing := func(name string) context.Context {
		c := newCaller(len(callers))
		callers[name] = c
		return metadata.AppendToOutgoingContext(context.Background(), "traceparent", c.traceparent())
	}
	cc := servetest.Dial(t, r.grpcAddr)

	ctx := outgoing("envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
	}

	ctx = outgoing("envoy.service.auth.v3.Authorization/Check")
	cresp, err := authv3.NewAuthorizationClient(cc).Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		ContextExtensions: map[string]string{"domain": "d"},
		Request:           &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/"}},
		Source:            &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "192.0.2.1"}}}},
	}})
	if err != nil || cresp.GetStatus().GetCode() != 0 {
		t.Fatalf("Check: %v, %v", cresp, err)
	}

	ctx = outgoing(rlqsSpanName)
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"k": "v"}}, NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("RLQS answer: %v", err)
	}
	stream.CloseSend()

	for name, req := range map[string]func() *http.Request{
		"POST /json": func() *http.Request {
			req, _ := http.NewRequest("POST", "http://"+r.httpAddr+"/json", strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`))
			return req
		},
		"GET /auth/{domain}": func() *http.Request {
			req, _ := http.NewRequest("GET", "http://"+r.httpAddr+"/auth/d", nil)
			return req
		},
	} {
		c := newCaller(len(callers))
		callers[name] = c
		req := req()
		req.Header.Set("traceparent", c.traceparent())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", name, resp.StatusCode)
		}
	}
	return callers
}

// rlqsSpanName is the span of an RLQS report (no span is made of the
// stream itself).
const rlqsSpanName = "rls.rlqs.report"

// checkTraces checks that each caller's trace holds rls's spans of one
// decision: the server span, child of the caller's, over rls.decide, over
// rls.match and rls.store (over rls.redis on Redis).
func checkTraces(t *testing.T, spans []otlptest.Span, callers map[string]callerTrace, store string) {
	t.Helper()
	byTrace := map[string][]otlptest.Span{}
	for _, s := range spans {
		byTrace[s.TraceID] = append(byTrace[s.TraceID], s)
	}
	for name, c := range callers {
		trace := byTrace[c.traceID]
		servers := otlptest.Named(trace, name)
		if len(servers) != 1 {
			t.Errorf("%s: %d server spans in its caller's trace, want 1; the trace:\n%s", name, len(servers), otlptest.Format(trace))
			continue
		}
		srv := servers[0]
		if srv.ParentID != c.spanID || srv.Kind.String() != "SPAN_KIND_SERVER" {
			t.Errorf("%s: parent %q, kind %v; want the caller's span %s, server", name, srv.ParentID, srv.Kind, c.spanID)
		}
		// An RLQS report decides twice here: the requests it says were
		// allowed before any grant are charged, then a grant is taken.
		decides := children(trace, srv, "rls.decide")
		if len(decides) != 1 && !(name == rlqsSpanName && len(decides) == 2) {
			t.Errorf("%s: %d rls.decide spans under the server span, want 1 (2 for an RLQS report); the trace:\n%s", name, len(decides), otlptest.Format(trace))
		}
		for _, decide := range decides {
			checkDecision(t, name, trace, decide, store)
		}
		switch {
		case strings.HasPrefix(name, "envoy."):
			if srv.Attrs["rpc.system"] != "grpc" || srv.Attrs["rpc.grpc.status_code"] != "0" {
				t.Errorf("%s: attributes %v, want rpc.system grpc, status code 0", name, srv.Attrs)
			}
		case name == rlqsSpanName:
			if srv.Attrs["rls.domain"] != "d" || srv.Attrs["rls.rlqs.buckets"] != "1" || srv.Attrs["rls.rlqs.actions"] != "1" {
				t.Errorf("%s: attributes %v, want domain d, 1 bucket, 1 action", name, srv.Attrs)
			}
		default:
			if srv.Attrs["http.response.status_code"] != "200" || srv.Attrs["http.route"] != strings.Fields(name)[1] {
				t.Errorf("%s: attributes %v, want status 200 and the route", name, srv.Attrs)
			}
		}
	}
}

// checkDecision checks an rls.decide span of trace and the spans under it.
func checkDecision(t *testing.T, name string, trace []otlptest.Span, decide otlptest.Span, store string) {
	t.Helper()
	if a := decide.Attrs; a["rls.domain"] != "d" || a["rls.descriptors"] != "1" || a["rls.code"] != "OK" {
		t.Errorf("%s: rls.decide attributes %v, want domain d, 1 descriptor, code OK", name, a)
	}
	match, st := children(trace, decide, "rls.match"), children(trace, decide, "rls.store")
	if len(match) != 1 || len(st) != 1 {
		t.Errorf("%s: %d rls.match, %d rls.store under rls.decide, want 1 and 1; the trace:\n%s", name, len(match), len(st), otlptest.Format(trace))
		return
	}
	if a := match[0].Attrs; a["rls.unmatched"] != "0" {
		t.Errorf("%s: rls.match attributes %v, want 0 unmatched", name, a)
	}
	if a := st[0].Attrs; a["rls.store"] != store || a["rls.items"] != "1" || a["rls.admitted"] != "true" {
		t.Errorf("%s: rls.store attributes %v, want store %s, 1 item, admitted", name, a, store)
	}
	redisSpans := children(trace, st[0], "rls.redis")
	switch {
	case store == string(Memory) && len(redisSpans) != 0:
		t.Errorf("%s: rls.redis spans on the memory store", name)
	case store == string(Redis) && len(redisSpans) != 1:
		t.Errorf("%s: %d rls.redis under rls.store, want 1; the trace:\n%s", name, len(redisSpans), otlptest.Format(trace))
	case store == string(Redis):
		rs := redisSpans[0]
		if a := rs.Attrs; a["db.system.name"] != "redis" || a["db.operation.name"] != "FCALL" || a["rls.redis.mode"] != "final" ||
			a["rls.items"] != "1" || rs.Kind.String() != "SPAN_KIND_CLIENT" || len(rs.Events) != 1 || rs.Events[0] != "rls.redis.sent" {
			t.Errorf("%s: rls.redis %v, kind %v, events %v; want redis FCALL final of 1 item, client, the sent event", name, a, rs.Kind, rs.Events)
		}
	}
}

// children returns the spans of trace called name whose parent is parent.
func children(trace []otlptest.Span, parent otlptest.Span, name string) []otlptest.Span {
	var out []otlptest.Span
	for _, s := range otlptest.Named(trace, name) {
		if s.ParentID == parent.SpanID {
			out = append(out, s)
		}
	}
	return out
}

// Without an endpoint there is no provider: nothing is exported, a
// traceparent changes nothing, and the gRPC server has no interceptor.
func TestTracingOff(t *testing.T) {
	recv := otlptest.Start(t)
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, tracedLimits)
	cfg := testConfig(path)
	cfg.Tracing.ServiceName = "rls-test" // no endpoint: off
	r := start(t, cfg)
	if r.tracing != nil || r.tracing.Tracer() != nil {
		t.Fatalf("tracing provider %v without an endpoint, want none", r.tracing)
	}
	decideOnEveryTransport(t, r)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := recv.Exports(); n != 0 {
		t.Errorf("the receiver got %d exports with tracing off", n)
	}
}

// BenchmarkTracingGRPC is one ShouldRateLimit over loopback gRPC, the
// daemon's whole path, with tracing off and on (every request sampled:
// the server span, rls.decide, rls.match and rls.store, batched to an
// in-process OTLP receiver, whose own work counts too).
func BenchmarkTracingGRPC(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "off", true: "on"}[on]
		b.Run(name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "limits.yaml")
			if err := os.WriteFile(path, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"), 0o644); err != nil {
				b.Fatal(err)
			}
			cfg := testConfig(path)
			if on {
				cfg.Tracing.Endpoint = otlptest.Start(b).GRPCAddr()
			}
			ctx, cancel := context.WithCancel(context.Background())
			s, err := New(ctx, cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			defer func() { cancel(); <-done }()
			g, _ := s.Addrs()
			client := rlsv3.NewRateLimitServiceClient(servetest.Dial(b, g.String()))
			req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
			rctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", newCaller(1).traceparent())
			b.ReportAllocs()
			for b.Loop() {
				if _, err := client.ShouldRateLimit(rctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
