package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/tracing"
	"github.com/rlsproject/rls/internal/tracing/otlptest"
)

// The tracing flags and the standard OTEL_ variables become the server's
// tracing Config: the flag first, then OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
// then OTEL_EXPORTER_OTLP_ENDPOINT; OTEL_SDK_DISABLED=true turns it all
// off.
func TestTracingFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want tracing.Config
	}{
		{"off by default", nil, nil, tracing.Config{}},
		{"a service name alone is off", nil, []string{"OTEL_SERVICE_NAME=edge"}, tracing.Config{}},
		{"flag", []string{"--otlp-endpoint", "127.0.0.1:4317"}, nil, tracing.Config{Endpoint: "127.0.0.1:4317"}},
		{"flag, plain text", []string{"--otlp-endpoint", "collector:4317", "--otlp-insecure"}, nil,
			tracing.Config{Endpoint: "collector:4317", TLS: tracing.TLSOff}},
		{"flag, TLS", []string{"--otlp-endpoint", "127.0.0.1:4317", "--otlp-insecure=false"}, nil,
			tracing.Config{Endpoint: "127.0.0.1:4317", TLS: tracing.TLSOn}},
		{"RLS_ variables", nil, []string{"RLS_OTLP_ENDPOINT=collector:4317", "RLS_OTLP_INSECURE=true"},
			tracing.Config{Endpoint: "collector:4317", TLS: tracing.TLSOff}},
		{"the flag wins", []string{"--otlp-endpoint", "a:1"}, []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://b:2"}, tracing.Config{Endpoint: "a:1"}},
		{"OTEL_ variables", nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_SERVICE_NAME=edge", "OTEL_EXPORTER_OTLP_INSECURE=true"},
			tracing.Config{BaseEndpoint: "http://collector:4318", Protocol: tracing.HTTP, ServiceName: "edge", TLS: tracing.TLSOff}},
		{"the traces' variables win", nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://b:2/t",
			"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf",
			"OTEL_EXPORTER_OTLP_INSECURE=true", "OTEL_EXPORTER_OTLP_TRACES_INSECURE=false"},
			tracing.Config{Endpoint: "http://b:2/t", BaseEndpoint: "http://a:1", Protocol: tracing.HTTP, TLS: tracing.TLSOn}},
		{"OTEL_SDK_DISABLED", []string{"--otlp-endpoint", "127.0.0.1:4317"}, []string{"OTEL_SDK_DISABLED=TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1"}, tracing.Config{}},
		{"OTEL_SDK_DISABLED=false", nil, []string{"OTEL_SDK_DISABLED=false", "OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1"}, tracing.Config{BaseEndpoint: "http://a:1"}},
		{"console: spans on stdout", nil, []string{"OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=edge"}, tracing.Config{Console: io.Discard, ServiceName: "edge"}},
		{"console alone leaves the OTLP variables", nil, []string{"OTEL_TRACES_EXPORTER=console", "OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1"}, tracing.Config{Console: io.Discard}},
		{"console beside OTLP", nil, []string{"OTEL_TRACES_EXPORTER=otlp, Console", "OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1"}, tracing.Config{Console: io.Discard, BaseEndpoint: "http://a:1"}},
		{"console and the flag", []string{"--otlp-endpoint", "a:1"}, []string{"OTEL_TRACES_EXPORTER=console"}, tracing.Config{Console: io.Discard, Endpoint: "a:1"}},
		{"none", nil, []string{"OTEL_TRACES_EXPORTER=none", "OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1"}, tracing.Config{}},
		{"none, the flag wins", []string{"--otlp-endpoint", "a:1"}, []string{"OTEL_TRACES_EXPORTER=none"}, tracing.Config{Endpoint: "a:1"}},
		{"OTEL_SDK_DISABLED beats console", nil, []string{"OTEL_TRACES_EXPORTER=console", "OTEL_SDK_DISABLED=true"}, tracing.Config{}},
	} {
		cfg, err := parseServeFlags(tc.args, tc.env, io.Discard)
		if err != nil {
			t.Errorf("%s: rls serve %q with %q: %v", tc.name, tc.args, tc.env, err)
			continue
		}
		if cfg.Tracing != tc.want {
			t.Errorf("%s: rls serve %q with %q: tracing %+v, want %+v", tc.name, tc.args, tc.env, cfg.Tracing, tc.want)
		}
	}
}

// A tracing setting rls cannot take stops the start (exit 2), naming it.
func TestTracingFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--otlp-endpoint", "collector"}, nil, `--otlp-endpoint: endpoint "collector" is not host:port or a URL`},
		{nil, []string{"RLS_OTLP_ENDPOINT=ftp://c:21"}, `RLS_OTLP_ENDPOINT (--otlp-endpoint): endpoint "ftp://c:21"`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=collector"}, `OTEL_EXPORTER_OTLP_ENDPOINT: endpoint "collector"`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:1", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"}, `OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" is not grpc or http/protobuf`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:1", "OTEL_EXPORTER_OTLP_INSECURE=maybe"}, `OTEL_EXPORTER_OTLP_INSECURE="maybe": not true or false`},
		{nil, []string{"OTEL_TRACES_EXPORTER=zipkin"}, `OTEL_TRACES_EXPORTER: "zipkin" is not otlp, console or none`},
	} {
		err := run(context.Background(), append([]string{"serve"}, tc.args...), tc.env, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || exitCode(err) != 2 {
			t.Errorf("rls serve %q with %q: %v (exit %d), want %q (exit 2)", tc.args, tc.env, err, exitCode(err), tc.want)
		}
	}
}

// rls serve --otlp-endpoint exports the spans of a decision, in the trace
// its caller sent, by the time it has stopped.
func TestTracingServe(t *testing.T) {
	recv := otlptest.Start(t)
	dir := t.TempDir()
	cfg := writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	s := startServer(t, []string{"OTEL_SERVICE_NAME=rls-serve"}, "--config", cfg, "--otlp-endpoint", recv.GRPCAddr())
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	if _, err := rlsv3.NewRateLimitServiceClient(s.dial(t)).ShouldRateLimit(ctx, rlRequest("d", "k", "v")); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+s.httpAddr+"/healthz", nil)
	req.Header.Set("traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	s.stop(t)
	spans := recv.WaitFor(t, 5*time.Second, "the decision's spans", func(s []otlptest.Span) bool { return len(s) >= 4 })
	names := map[string]bool{}
	for _, sp := range spans {
		names[sp.Name] = true
		if sp.TraceID != traceID || sp.Resource["service.name"] != "rls-serve" {
			t.Errorf("%v: resource %v; want trace %s, service rls-serve", sp, sp.Resource, traceID)
		}
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "rls.decide", "rls.match", "rls.store"} {
		if !names[want] {
			t.Errorf("no %s span; got:\n%s", want, otlptest.Format(spans))
		}
	}
	if len(spans) != 4 {
		t.Errorf("%d spans, want 4 (none for /healthz):\n%s", len(spans), otlptest.Format(spans))
	}
}

// rls serve with OTEL_TRACES_EXPORTER=console prints the spans of a
// decision on its stdout, one JSON object per line, in the trace its
// caller sent: spans seen without a collector.
func TestTracingConsoleServe(t *testing.T) {
	dir := t.TempDir()
	cfgPath := writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	grpcAddr, httpAddr := servetest.Addr(t), servetest.Addr(t)
	env := []string{"OTEL_TRACES_EXPORTER=console"}
	var stdout servetest.SyncBuffer
	cfg, err := parseServeFlags([]string{"--config", cfgPath, "--grpc-addr", grpcAddr, "--http-addr", httpAddr}, env, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	s := serveConfig(t, cfg, env, grpcAddr, httpAddr)
	s.waitUntil(t, "rls answers /healthz", proctest.HTTPOK("http://"+httpAddr+"/healthz"))
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-b7ad6b7169203331-01")
	if _, err := rlsv3.NewRateLimitServiceClient(s.dial(t)).ShouldRateLimit(ctx, rlRequest("d", "k", "v")); err != nil {
		t.Fatal(err)
	}
	s.stop(t) // flushes the spans
	names := map[string]bool{}
	for line := range strings.Lines(stdout.String()) {
		var span struct {
			Name        string
			SpanContext struct{ TraceID string }
		}
		if err := json.Unmarshal([]byte(line), &span); err != nil {
			t.Fatalf("stdout line %q is not a span: %v", line, err)
		}
		if span.SpanContext.TraceID != traceID {
			t.Errorf("span %s in trace %s, want %s", span.Name, span.SpanContext.TraceID, traceID)
		}
		names[span.Name] = true
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "rls.decide", "rls.match", "rls.store"} {
		if !names[want] {
			t.Errorf("no %s span on stdout; got:\n%s", want, stdout.String())
		}
	}
}
