// Package tracing sets up rls's OpenTelemetry tracing: when a Config names
// an OTLP receiver (or a console), a TracerProvider that exports there in
// batches, the W3C
// propagators (traceparent, tracestate, baggage), and the server spans of
// the decision RPCs and HTTP routes, which continue the caller's trace
// (server.go). Off, it builds nothing and a nil *Provider stands for it, so
// that a server without tracing runs exactly the code it ran before. It
// knows nothing of rate limiting: the service, the stores and RLQS make
// their own spans with the Tracer it gives, and say what they mean.
//
// The environment is read by the front ends, not here (they fill Config);
// what the OpenTelemetry SDK reads by itself is left to it: the sampler
// (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG) when Config.Sampler is
// nil, the exporter's headers, certificates, timeout and compression
// (OTEL_EXPORTER_OTLP_*), the batching (OTEL_BSP_*), span limits and
// OTEL_RESOURCE_ATTRIBUTES.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
)

// Protocol is the OTLP transport.
type Protocol uint8

// The protocols.
const (
	// GRPC is OTLP over gRPC (receivers listen on 4317): rls's default.
	GRPC Protocol = iota
	// HTTP is OTLP over HTTP with protobuf bodies (port 4318), envoyproxy/ratelimit's
	// default.
	HTTP
)

// ParseProtocol reads a protocol as OTEL_EXPORTER_OTLP_PROTOCOL and
// envoyproxy/ratelimit's TRACING_EXPORTER_PROTOCOL name it: grpc, or
// http/protobuf (http for short).
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(s) {
	case "grpc":
		return GRPC, nil
	case "http", "http/protobuf":
		return HTTP, nil
	}
	return 0, fmt.Errorf("%q is not grpc or http/protobuf", s)
}

func (p Protocol) String() string {
	if p == HTTP {
		return "http/protobuf"
	}
	return "grpc"
}

// TLSMode says whether spans sent to a host:port endpoint go over TLS. (A
// URL's scheme says it for itself: http plain text, https TLS.)
type TLSMode uint8

// The modes.
const (
	// TLSAuto is plain text to a loopback host (127.0.0.0/8, ::1,
	// localhost), where a collector runs beside rls, and TLS elsewhere.
	TLSAuto TLSMode = iota
	// TLSOff is plain text (--otlp-insecure, OTEL_EXPORTER_OTLP_INSECURE=true).
	TLSOff
	// TLSOn is TLS, verified against the system's roots (or
	// OTEL_EXPORTER_OTLP_CERTIFICATE, which the exporter reads itself).
	TLSOn
)

// Config says whether and where rls exports spans. The zero Config is
// tracing off.
type Config struct {
	// Endpoint is the OTLP receiver: host:port, or a URL whose scheme says
	// plain text (http://) or TLS (https://). Over HTTP a URL's path is the
	// traces path as it is (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and a
	// host:port's is /v1/traces.
	Endpoint string
	// BaseEndpoint, used when Endpoint is empty, is the receiver as
	// OTEL_EXPORTER_OTLP_ENDPOINT gives it: over HTTP /v1/traces is added
	// to its path.
	BaseEndpoint string
	Protocol     Protocol
	// TLS applies to a host:port endpoint.
	TLS TLSMode
	// ServiceName is the service.name of the spans' resource (default
	// "rls"); ServiceNamespace and ServiceInstanceID, when set, its
	// service.namespace and service.instance.id.
	ServiceName, ServiceNamespace, ServiceInstanceID string
	// Console, when set, receives every span too, as one JSON object per
	// line (the SDK's stdout exporter): OTEL_TRACES_EXPORTER=console, to
	// see spans without a collector.
	Console io.Writer
	// Sampler decides which traces that reach rls are recorded; nil is the
	// SDK's, which OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG choose
	// (default parentbased_always_on: a trace whose caller sampled it, and
	// every trace that starts here).
	Sampler sdktrace.Sampler
}

// On reports whether c exports spans.
func (c Config) On() bool { return c.otlp() || c.Console != nil }

// otlp reports whether c names an OTLP receiver.
func (c Config) otlp() bool { return c.Endpoint != "" || c.BaseEndpoint != "" }

// DefaultServiceName is the service.name of rls's spans when the Config
// names none.
const DefaultServiceName = "rls"

// ScopeName is the instrumentation scope of every span rls makes.
const ScopeName = "github.com/rlsproject/rls"

// Provider is tracing, on: the SDK's TracerProvider, its exporter and the
// propagators. A nil *Provider is tracing off: its Tracer is nil, its
// server options none, its Handler the handler it is given, its Shutdown
// nothing. Its methods are safe for concurrent use; Shutdown is called
// once, when the server has stopped serving.
type Provider struct {
	tp         *sdktrace.TracerProvider
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	endpoint   string // for the log; "" without OTLP
}

// Start returns the Provider of c, nil when c is off. Nothing is
// connected yet: spans are sent in the background, the first batch at the
// latest five seconds after it starts, and a receiver that does not answer
// costs dropped spans (logged at a bounded rate to log), never a decision.
func Start(ctx context.Context, c Config, log *slog.Logger) (*Provider, error) {
	if !c.On() {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var exps []sdktrace.SpanExporter
	stop := func() {
		for _, e := range exps {
			e.Shutdown(ctx)
		}
	}
	endpoint := ""
	if c.otlp() {
		exp, ep, err := newExporter(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
		endpoint = ep
		exps = append(exps, &loggedExporter{SpanExporter: exp, log: log, endpoint: endpoint, every: rate.Sometimes{Interval: 10 * time.Second}})
	}
	if c.Console != nil {
		exp, err := stdouttrace.New(stdouttrace.WithWriter(c.Console))
		if err != nil {
			stop()
			return nil, fmt.Errorf("tracing: console: %w", err)
		}
		exps = append(exps, &loggedExporter{SpanExporter: exp, log: log, endpoint: "console", every: rate.Sometimes{Interval: 10 * time.Second}})
	}
	res, err := newResource(ctx, c)
	if err != nil {
		stop()
		return nil, fmt.Errorf("tracing: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, e := range exps {
		// Batched, each: a decision never waits for an exporter.
		opts = append(opts, sdktrace.WithBatcher(e))
	}
	if c.Sampler != nil {
		opts = append(opts, sdktrace.WithSampler(c.Sampler))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return &Provider{
		tp:         tp,
		tracer:     tp.Tracer(ScopeName),
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		endpoint:   endpoint,
	}, nil
}

// Tracer returns the tracer of rls's spans, nil when p is off: the parts
// of the server that make spans take nil as "no spans", and test for it
// before they spend anything on one.
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tracer
}

// Endpoint is the OTLP receiver p sends spans to ("" when off or without
// one), as the start's log line says it.
func (p *Provider) Endpoint() string {
	if p == nil {
		return ""
	}
	return p.endpoint
}

// Shutdown sends the spans still buffered, within ctx, and stops the
// exporter. Nothing when p is off.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.Shutdown(ctx)
}

// newExporter returns the exporter of c and the endpoint it sends to, as
// the log names it. Over TLS no TLS option is given: the exporter's own
// default is TLS, verified against the system's roots or the files of
// OTEL_EXPORTER_OTLP_CERTIFICATE (and _CLIENT_CERTIFICATE, _CLIENT_KEY),
// which an option would replace.
func newExporter(ctx context.Context, c Config) (sdktrace.SpanExporter, string, error) {
	endpoint, isURL, err := c.endpoint()
	if err != nil {
		return nil, "", err
	}
	plain := !isURL && c.plain(endpoint)
	if c.Protocol == HTTP {
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(endpoint)}
		if isURL {
			opts = []otlptracehttp.Option{otlptracehttp.WithEndpointURL(endpoint)}
		} else if plain {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		return exp, endpoint, err
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(endpoint)}
	if isURL {
		opts = []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(endpoint)}
	} else if plain {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	return exp, endpoint, err
}

// Check reports what is wrong with c's endpoint, nil when c names none or
// its endpoint is host:port or an http:// or https:// URL.
func (c Config) Check() error {
	if !c.otlp() {
		return nil
	}
	_, _, err := c.endpoint()
	return err
}

// endpoint returns the receiver that c names, whether it is a URL (else
// host:port), or why it names none.
func (c Config) endpoint() (string, bool, error) {
	e, base := c.Endpoint, false
	if e == "" {
		e, base = c.BaseEndpoint, true
	}
	if !strings.Contains(e, "://") {
		if _, _, err := net.SplitHostPort(e); err != nil {
			return "", false, fmt.Errorf("endpoint %q is not host:port or a URL (http://host:port, https://host:port)", e)
		}
		return e, false, nil
	}
	u, err := url.Parse(e)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false, fmt.Errorf("endpoint %q is not host:port or a URL (http://host:port, https://host:port)", e)
	}
	if base && c.Protocol == HTTP {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	return u.String(), true, nil
}

// plain reports whether spans go to host:port endpoint in plain text.
func (c Config) plain(endpoint string) bool {
	switch c.TLS {
	case TLSOff:
		return true
	case TLSOn:
		return false
	}
	host, _, _ := net.SplitHostPort(endpoint)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newResource returns the resource of rls's spans: the SDK's own
// attributes, OTEL_RESOURCE_ATTRIBUTES, then c's service.
func newResource(ctx context.Context, c Config) (*resource.Resource, error) {
	name := c.ServiceName
	if name == "" {
		name = DefaultServiceName
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if c.ServiceNamespace != "" {
		attrs = append(attrs, attribute.String("service.namespace", c.ServiceNamespace))
	}
	if c.ServiceInstanceID != "" {
		attrs = append(attrs, attribute.String("service.instance.id", c.ServiceInstanceID))
	}
	// Later options win: c's service over the environment's.
	return resource.New(ctx, resource.WithTelemetrySDK(), resource.WithFromEnv(), resource.WithAttributes(attrs...))
}

// loggedExporter logs the exporter's failures to rls's log, at a bounded
// rate, and hides them from the SDK, whose own report would go to a
// process-wide logger.
type loggedExporter struct {
	sdktrace.SpanExporter
	log      *slog.Logger
	endpoint string
	every    rate.Sometimes
}

func (e *loggedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if err := e.SpanExporter.ExportSpans(ctx, spans); err != nil && !errors.Is(err, context.Canceled) {
		e.every.Do(func() {
			e.log.Warn("tracing: spans not exported", "endpoint", e.endpoint, "spans", len(spans), "error", err)
		})
	}
	return nil
}
