package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
	"github.com/rlsproject/rls/internal/tracing/otlptest"
)

// A caller's trace: its trace id and the id of its span, rls's parent.
const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan  = "00f067aa0ba902b7"
	traceparent = "00-" + traceID + "-" + callerSpan + "-01"
)

// start starts tracing on c for the test, shut down when it ends.
func start(t *testing.T, c Config) *Provider {
	t.Helper()
	p, err := Start(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Start(%+v): %v", c, err)
	}
	t.Cleanup(func() { p.Shutdown(context.Background()) })
	return p
}

// serve serves gs on a loopback port until the test ends, and returns a
// connection to it.
func serve(t *testing.T, gs *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return servetest.Dial(t, lis.Addr().String())
}

// flush sends what p has buffered.
func flush(t *testing.T, p *Provider) {
	t.Helper()
	if err := p.tp.ForceFlush(context.Background()); err != nil {
		t.Fatalf("ForceFlush: %v", err)
	}
}

// Off, tracing is nothing: no provider, no tracer, no server options, the
// handler itself.
func TestOff(t *testing.T) {
	p, err := Start(context.Background(), Config{ServiceName: "x", Protocol: HTTP}, nil)
	if p != nil || err != nil {
		t.Fatalf("Start(no endpoint) = %v, %v; want nil, nil", p, err)
	}
	if p.Tracer() != nil || p.ServerOptions([]string{"/a/b"}, nil) != nil || p.Endpoint() != "" || p.Shutdown(context.Background()) != nil {
		t.Errorf("a nil Provider: Tracer %v, ServerOptions %v, Endpoint %q; want nil, nil, \"\"", p.Tracer(), p.ServerOptions(nil, nil), p.Endpoint())
	}
	h := http.NotFoundHandler()
	if got := p.Handler(h, func(*http.Request) string { return "/x" }); got == nil || func() bool {
		// The same handler: a request through it is served as by h.
		w := httptest.NewRecorder()
		got.ServeHTTP(w, httptest.NewRequest("GET", "/x", nil))
		return w.Code != http.StatusNotFound
	}() {
		t.Errorf("a nil Provider's Handler does not serve as the handler it wraps")
	}
}

// Spans reach the receiver over either protocol, with rls's resource.
func TestExport(t *testing.T) {
	recv := otlptest.Start(t)
	for _, c := range []Config{
		{Endpoint: recv.GRPCAddr(), ServiceName: "rls-a", ServiceNamespace: "edge", ServiceInstanceID: "rls-0"},
		{Endpoint: recv.HTTPAddr(), Protocol: HTTP, ServiceName: "rls-b"},
		{BaseEndpoint: "http://" + recv.HTTPAddr(), Protocol: HTTP, ServiceName: "rls-c"},
		{Endpoint: "http://" + recv.HTTPAddr() + "/v1/traces", Protocol: HTTP, ServiceName: "rls-d"},
		{BaseEndpoint: "http://" + recv.GRPCAddr(), ServiceName: "rls-e"},
	} {
		for _, s := range exportOne(t, recv, c) {
			if s.Name != "test.span" || s.Scope != ScopeName || s.ViaHTTP != (c.Protocol == HTTP) ||
				s.Resource["service.namespace"] != c.ServiceNamespace || s.Resource["service.instance.id"] != c.ServiceInstanceID {
				t.Errorf("%+v: got %v with resource %v (via HTTP %v), want test.span of scope %s, namespace %q, instance %q",
					c, s, s.Resource, s.ViaHTTP, ScopeName, c.ServiceNamespace, c.ServiceInstanceID)
			}
		}
	}
}

// consoleSpan is the part of a span that the console exporter writes
// (the SDK's stdout exporter: one JSON object per line) that tests read.
type consoleSpan struct {
	Name        string
	SpanContext struct{ TraceID string }
	Parent      struct{ SpanID string }
	Resource    []struct {
		Key   string
		Value struct{ Value any }
	}
	InstrumentationScope struct{ Name string }
}

// consoleSpans parses what the console exporter wrote.
func consoleSpans(t *testing.T, out string) []consoleSpan {
	t.Helper()
	var spans []consoleSpan
	for line := range strings.Lines(out) {
		var s consoleSpan
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			t.Fatalf("console line %q: %v", line, err)
		}
		spans = append(spans, s)
	}
	return spans
}

// A Config with a Console and no endpoint writes spans there, one JSON
// object per line, with rls's resource and the caller's trace; beside an
// endpoint, to both.
func TestConsole(t *testing.T) {
	recv := otlptest.Start(t)
	for _, tc := range []struct {
		name string
		c    Config
	}{
		{"console alone", Config{ServiceName: "rls-console"}},
		{"console and OTLP", Config{ServiceName: "rls-both", Endpoint: recv.GRPCAddr()}},
	} {
		var out bytes.Buffer
		tc.c.Console = &out
		p := start(t, tc.c)
		ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
		_, span := p.Tracer().Start(ctx, "test.span")
		span.End()
		if err := p.Shutdown(context.Background()); err != nil { // flushes, and out is ours again
			t.Fatalf("%s: Shutdown: %v", tc.name, err)
		}
		spans := consoleSpans(t, out.String())
		if len(spans) != 1 {
			t.Fatalf("%s: %d spans on the console, want 1:\n%s", tc.name, len(spans), out.String())
		}
		s := spans[0]
		name := ""
		for _, kv := range s.Resource {
			if kv.Key == "service.name" {
				name, _ = kv.Value.Value.(string)
			}
		}
		if s.Name != "test.span" || s.SpanContext.TraceID != traceID || s.Parent.SpanID != callerSpan || name != tc.c.ServiceName || s.InstrumentationScope.Name != ScopeName {
			t.Errorf("%s: console span %+v, want test.span in trace %s under %s, service %s, scope %s", tc.name, s, traceID, callerSpan, tc.c.ServiceName, ScopeName)
		}
		if tc.c.Endpoint != "" {
			recv.WaitFor(t, 10*time.Second, "the span over OTLP too", func(spans []otlptest.Span) bool {
				for _, s := range spans {
					if s.Resource["service.name"] == tc.c.ServiceName {
						return true
					}
				}
				return false
			})
		}
	}
}

// exportOne starts tracing on c, whose service name is its own, makes a
// span "test.span", and returns the spans of that service that recv gets.
func exportOne(t *testing.T, recv *otlptest.Receiver, c Config) []otlptest.Span {
	t.Helper()
	p := start(t, c)
	_, span := p.Tracer().Start(context.Background(), "test.span")
	span.End()
	flush(t, p)
	var mine []otlptest.Span
	recv.WaitFor(t, 10*time.Second, "a span of "+c.ServiceName, func(spans []otlptest.Span) bool {
		mine = mine[:0]
		for _, s := range spans {
			if s.Resource["service.name"] == c.ServiceName {
				mine = append(mine, s)
			}
		}
		return len(mine) > 0
	})
	return mine
}

// Over TLS the exporter verifies the receiver with the CA of
// OTEL_EXPORTER_OTLP_CERTIFICATE and presents the client certificate of
// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: rls gives no TLS option that
// would replace them.
func TestExportTLS(t *testing.T) {
	pki := testpki.New(t)
	t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", pki.CA)
	t.Setenv("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", pki.Cert)
	t.Setenv("OTEL_EXPORTER_OTLP_CLIENT_KEY", pki.Key)
	recv := otlptest.StartTLS(t, pki.ServerTLS(t))
	for _, c := range []Config{
		{Endpoint: recv.GRPCAddr(), TLS: TLSOn, ServiceName: "tls-grpc"},
		{Endpoint: recv.HTTPAddr(), TLS: TLSOn, Protocol: HTTP, ServiceName: "tls-http"},
		{BaseEndpoint: "https://" + recv.HTTPAddr(), Protocol: HTTP, ServiceName: "tls-url"},
	} {
		exportOne(t, recv, c)
	}
}

// Without a service name, spans are rls's.
func TestDefaultServiceName(t *testing.T) {
	recv := otlptest.Start(t)
	p := start(t, Config{Endpoint: recv.GRPCAddr()})
	_, span := p.Tracer().Start(context.Background(), "test.span")
	span.End()
	flush(t, p)
	s := recv.WaitFor(t, 10*time.Second, "a span", func(s []otlptest.Span) bool { return len(s) > 0 })[0]
	if s.Resource["service.name"] != "rls" || s.Resource["telemetry.sdk.language"] != "go" {
		t.Errorf("resource %v, want service.name rls and the SDK's attributes", s.Resource)
	}
}

// The server spans: a traced gRPC method continues the caller's trace from
// its metadata, an untraced one (health) makes no span; a stream of a
// traced stream method carries the caller's context; an HTTP route
// continues the trace of its headers.
func TestServerSpans(t *testing.T) {
	recv := otlptest.Start(t)
	p := start(t, Config{Endpoint: recv.GRPCAddr()})

	gs := grpc.NewServer(p.ServerOptions([]string{healthpb.Health_Check_FullMethodName}, []string{healthpb.Health_Watch_FullMethodName})...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	client := healthpb.NewHealthClient(serve(t, gs))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent, "tracestate", "vendor=x")
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); err == nil {
		t.Fatal("Check(unknown service) succeeded")
	}
	if _, err := client.List(ctx, &healthpb.HealthListRequest{}); err != nil {
		t.Fatalf("List: %v", err)
	}

	web := httptest.NewServer(p.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}), func(r *http.Request) string {
		if r.URL.Path == "/healthz" {
			return ""
		}
		return "/route"
	}))
	defer web.Close()
	for _, path := range []string{"/ok", "/fail", "/healthz", "/odd"} {
		method := "POST"
		if path == "/odd" {
			method = "BREW" // a made-up method: one span name for all of them
		}
		req, _ := http.NewRequest(method, web.URL+path, strings.NewReader("{}"))
		req.Header.Set("traceparent", traceparent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	flush(t, p)

	spans := recv.WaitFor(t, 10*time.Second, "five server spans", func(s []otlptest.Span) bool { return len(s) >= 5 })
	if len(spans) != 5 {
		t.Errorf("got %d spans, want 5 (two Checks, two POST /route, HTTP /route; none for List or /healthz):\n%s", len(spans), otlptest.Format(spans))
	}
	if odd := otlptest.Named(spans, "HTTP /route"); len(odd) != 1 || odd[0].Attrs["http.request.method"] != "_OTHER" {
		t.Errorf("a made-up method: spans %v, want one HTTP /route with method _OTHER", odd)
	}
	checks := otlptest.Named(spans, "grpc.health.v1.Health/Check")
	posts := otlptest.Named(spans, "POST /route")
	if len(checks) != 2 || len(posts) != 2 {
		t.Fatalf("got %d Check spans and %d POST /route, want 2 and 2:\n%s", len(checks), len(posts), otlptest.Format(spans))
	}
	for _, s := range append(checks, posts...) {
		if s.TraceID != traceID || s.ParentID != callerSpan || s.Kind != 2 /* SERVER */ {
			t.Errorf("%v: want trace %s, parent %s, kind server", s, traceID, callerSpan)
		}
	}
	for i, code := range []string{"0", "5"} { // OK, NotFound
		s := checks[i]
		if s.Attrs["rpc.system"] != "grpc" || s.Attrs["rpc.service"] != "grpc.health.v1.Health" || s.Attrs["rpc.method"] != "Check" ||
			s.Attrs["rpc.grpc.status_code"] != code {
			t.Errorf("Check %d: %v, want rpc attributes and status code %s", i, s, code)
		}
	}
	for _, s := range checks {
		if s.StatusCode.String() != "STATUS_CODE_UNSET" {
			t.Errorf("%v: want no error status (NotFound is the client's fault)", s)
		}
	}
	for i, want := range []struct{ code, status string }{{"200", "STATUS_CODE_UNSET"}, {"503", "STATUS_CODE_ERROR"}} {
		s := posts[i]
		if s.Attrs["http.request.method"] != "POST" || s.Attrs["http.route"] != "/route" || s.Attrs["http.response.status_code"] != want.code ||
			s.StatusCode.String() != want.status {
			t.Errorf("POST %d: %v, want method, route, status code %s, span status %s", i, s, want.code, want.status)
		}
	}
}

// A traced stream's handler sees the caller's trace context in its
// stream's Context.
func TestStreamContext(t *testing.T) {
	recv := otlptest.Start(t)
	p := start(t, Config{Endpoint: recv.GRPCAddr()})
	opts := p.ServerOptions(nil, []string{"/s/Stream"})
	var seen string
	handler := func(_ any, ss grpc.ServerStream) error {
		_, span := p.Tracer().Start(ss.Context(), "message")
		seen = span.SpanContext().TraceID().String()
		span.End()
		return nil
	}
	conn := serve(t, grpc.NewServer(append(opts, grpc.UnknownServiceHandler(handler))...))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent)
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/s/Stream")
	if err != nil {
		t.Fatal(err)
	}
	st.CloseSend()
	st.RecvMsg(new(healthpb.HealthCheckResponse)) // the stream's end
	if seen != traceID {
		t.Errorf("a span of the stream's handler is in trace %q, want the caller's %s", seen, traceID)
	}
	flush(t, p)
	s := recv.WaitFor(t, 10*time.Second, "the message's span", func(s []otlptest.Span) bool { return len(s) > 0 })
	if len(s) != 1 || s[0].Name != "message" || s[0].ParentID != callerSpan {
		t.Errorf("got %s, want only the handler's span, child of the caller's (no span of the stream itself)", otlptest.Format(s))
	}
}

// Endpoints: host:port, or a URL; over HTTP a base URL gets /v1/traces;
// loopback hosts are plain text by default.
func TestEndpoint(t *testing.T) {
	for _, tc := range []struct {
		c         Config
		want      string
		url       bool
		plain     bool
		wantError bool
	}{
		{c: Config{Endpoint: "127.0.0.1:4317"}, want: "127.0.0.1:4317", plain: true},
		{c: Config{Endpoint: "localhost:4317"}, want: "localhost:4317", plain: true},
		{c: Config{Endpoint: "[::1]:4317"}, want: "[::1]:4317", plain: true},
		{c: Config{Endpoint: "collector:4317"}, want: "collector:4317", plain: false},
		{c: Config{Endpoint: "collector:4317", TLS: TLSOff}, want: "collector:4317", plain: true},
		{c: Config{Endpoint: "127.0.0.1:4317", TLS: TLSOn}, want: "127.0.0.1:4317", plain: false},
		{c: Config{Endpoint: "https://collector:4318/custom", Protocol: HTTP}, want: "https://collector:4318/custom", url: true},
		{c: Config{BaseEndpoint: "https://collector:4318", Protocol: HTTP}, want: "https://collector:4318/v1/traces", url: true},
		{c: Config{BaseEndpoint: "http://collector:4318/otlp/", Protocol: HTTP}, want: "http://collector:4318/otlp/v1/traces", url: true},
		{c: Config{BaseEndpoint: "http://collector:4317"}, want: "http://collector:4317", url: true},
		{c: Config{Endpoint: "http://a:1", BaseEndpoint: "http://b:2"}, want: "http://a:1", url: true},
		{c: Config{Endpoint: "collector"}, wantError: true},
		{c: Config{Endpoint: "ftp://collector:21"}, wantError: true},
		{c: Config{BaseEndpoint: "http://"}, wantError: true},
	} {
		got, isURL, err := tc.c.endpoint()
		if tc.wantError {
			if err == nil || tc.c.Check() == nil {
				t.Errorf("%+v: endpoint %q, want an error", tc.c, got)
			}
			continue
		}
		if err != nil || got != tc.want || isURL != tc.url || (!isURL && tc.c.plain(got) != tc.plain) {
			t.Errorf("%+v: endpoint %q (URL %v, plain %v, %v), want %q (URL %v, plain %v)", tc.c, got, isURL, !isURL && tc.c.plain(got), err, tc.want, tc.url, tc.plain)
		}
	}
	if (Config{}).Check() != nil {
		t.Error("Check of tracing off is an error")
	}
}

func TestParseProtocol(t *testing.T) {
	for in, want := range map[string]Protocol{"grpc": GRPC, "GRPC": GRPC, "http": HTTP, "http/protobuf": HTTP} {
		if got, err := ParseProtocol(in); got != want || err != nil {
			t.Errorf("ParseProtocol(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseProtocol("http/json"); err == nil {
		t.Error("ParseProtocol(http/json) succeeded; rls sends protobuf only")
	}
}

// A receiver that does not answer costs a warning, at a bounded rate, and
// never blocks the shutdown beyond its context.
func TestUnreachableReceiver(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	logs := &servetest.SyncBuffer{}
	p, err := Start(context.Background(), Config{Endpoint: addr, Protocol: HTTP}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer().Start(context.Background(), "lost")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	began := time.Now()
	p.Shutdown(ctx)
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("Shutdown took %s with a 2s context", d)
	}
	if !strings.Contains(logs.String(), "tracing: spans not exported") {
		t.Errorf("logs %q, want a warning that spans were not exported", logs.String())
	}
}
