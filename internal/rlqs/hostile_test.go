package rlqs

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/tracing/spans"
)

// serve serves s on a loopback port until the test ends and returns a
// client on a connection to it.
func serve(t *testing.T, s *Server) *grpc.ClientConn {
	t.Helper()
	return servetest.GRPC(t, s.Register)
}

// TestBucketIDBytes is the regression test of bucket ids bounded by their
// number only (800 reports of about 0.9 MiB held 1.68 GB): a bucket id's
// bytes are bounded, and so are all the bucket ids one stream holds.
func TestBucketIDBytes(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	servers, _ := processes(t, 1, perMinute, clock)
	ctx := context.Background()

	// One bucket id of 0.9 MiB.
	ss := servers[0].NewSession()
	_, err := ss.Report(ctx, reportOf("llm", map[string]string{"model": strings.Repeat("g", 900<<10)}, 1))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a bucket id of 0.9 MiB: %v, want InvalidArgument", err)
	}

	// Many bucket ids of the most bytes one may have, on one stream: what
	// the stream holds stays within its bound.
	ss = servers[0].NewSession()
	held := 0
	for i := range 5000 {
		id := map[string]string{"model": strings.Repeat("g", 4000) + string(rune('a'+i%26)) + strings.Repeat("x", i/26)}
		if _, err := ss.Report(ctx, reportOf("llm", id, 1)); err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("report %d: %v, want ResourceExhausted past the stream's bound", i, err)
			}
			break
		}
		held += len("model") + len(id["model"])
	}
	t.Logf("one stream held %d bytes of bucket ids", held)
	if held > MaxStreamBytes {
		t.Errorf("one stream held %d bytes of bucket ids, more than its bound %d", held, MaxStreamBytes)
	}
}

// TestStreamsOfOneConnection is the regression test of idle streams that
// locked every other RLQS client out (10,000 of them over 12
// connections): one connection holds MaxStreamsPerConnection streams at
// most, and the next one is refused; another connection is served.
func TestStreamsOfOneConnection(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	servers, _ := processes(t, 1, perMinute, clock)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc := serve(t, servers[0])
	client := rlqsv3.NewRateLimitQuotaServiceClient(cc)
	var streams []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	for range MaxStreamsPerConnection {
		s, err := client.StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	// Each of them is served: a report is answered.
	for i, s := range streams {
		if err := s.Send(reportOf("llm", map[string]string{"model": "gpt"}, 1)); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatalf("stream %d of one connection: %v, want an answer", i, err)
		}
	}
	extra, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := extra.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("stream %d of one connection: %v, want ResourceExhausted", MaxStreamsPerConnection+1, err)
	}
	other, err := rlqsv3.NewRateLimitQuotaServiceClient(servetest.Dial(t, cc.Target())).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Send(reportOf("llm", map[string]string{"model": "gpt"}, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Recv(); err != nil {
		t.Errorf("a stream of another connection: %v, want an answer", err)
	}
}

// TestFirstReportDeadline is the regression test of streams that never
// report, held without end: a stream whose first report does not come
// within Options.FirstReport is ended (DeadlineExceeded).
func TestFirstReportDeadline(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	servers, _ := processes(t, 1, perMinute, clock)
	svc := servers[0].svc
	srv := New(svc, Options{Now: clock.Now, FirstReport: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(serve(t, srv)).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Recv()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a stream that sends nothing: %v, want DeadlineExceeded (the first report's deadline, not the test's)", err)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Errorf("the test's own deadline ended the stream")
	}
}

// TestUnknownDomain: a stream whose domain the config does not have gets
// ALLOW_ALL (a bucket that names no limit), for a time to live that lasts
// past the next report and no longer, and rls_rlqs_unknown_domain_total
// counts it.
func TestUnknownDomain(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	servers, _ := processes(t, 1, perMinute, clock)
	resp, err := servers[0].NewSession().Report(context.Background(), reportOf("nope", map[string]string{"model": "gpt"}, 1))
	if err != nil {
		t.Fatal(err)
	}
	q := resp.GetBucketAction()[0].GetQuotaAssignmentAction()
	if rule := q.GetRateLimitStrategy().GetBlanketRule().String(); rule != "ALLOW_ALL" {
		t.Errorf("a bucket of an unknown domain: %v, want ALLOW_ALL", q)
	}
	if ttl := q.GetAssignmentTimeToLive().AsDuration(); ttl <= DefaultInterval || ttl > 2*DefaultInterval {
		t.Errorf("ALLOW_ALL for an unknown domain lives %v, want past the next report (%v) and at most twice that", ttl, DefaultInterval)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(servers[0].Collectors()...)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := -1.0
	for _, f := range families {
		if f.GetName() == "rls_rlqs_unknown_domain_total" {
			got = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if got != 1 {
		t.Errorf("rls_rlqs_unknown_domain_total = %v after one bucket of an unknown domain, want 1 (-1: no such metric)", got)
	}
}

// TestSpanAttributesBounded is the regression test of a 1 MB domain put
// in span attributes (span exports then passed 64 MiB and were dropped):
// every string a report's span carries is bounded.
func TestSpanAttributesBounded(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	servers, _ := processes(t, 1, perMinute, clock)
	svc := servers[0].svc
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	srv := New(svc, Options{Now: clock.Now, Tracer: tp.Tracer("test")})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(serve(t, srv)).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(reportOf(strings.Repeat("d", 1<<20-1000), map[string]string{"model": "gpt"}, 1)); err != nil {
		t.Fatal(err)
	}
	s.Recv()
	s.CloseSend()
	for _, span := range rec.Ended() {
		for _, a := range span.Attributes() {
			if n := len(a.Value.String()); n > spans.MaxString {
				t.Errorf("span %s: attribute %s of %d bytes, more than %d", span.Name(), a.Key, n, spans.MaxString)
			}
		}
		if n := len(span.Status().Description); n > spans.MaxString {
			t.Errorf("span %s: status description of %d bytes, more than %d", span.Name(), n, spans.MaxString)
		}
		for _, ev := range span.Events() {
			for _, a := range ev.Attributes {
				if n := len(a.Value.String()); n > spans.MaxString {
					t.Errorf("span %s: event %s: attribute %s of %d bytes, more than %d", span.Name(), ev.Name, a.Key, n, spans.MaxString)
				}
			}
		}
	}
	if len(rec.Ended()) == 0 {
		t.Errorf("no span ended")
	}
}
