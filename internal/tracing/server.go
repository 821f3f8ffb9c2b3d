package tracing

import (
	"context"
	"net/http"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The attributes of the server spans (README "Tracing"), after
// OpenTelemetry's semantic conventions for RPC and HTTP servers.
const (
	AttrRPCSystem      = attribute.Key("rpc.system")           // "grpc"
	AttrRPCService     = attribute.Key("rpc.service")          // envoy.service.ratelimit.v3.RateLimitService
	AttrRPCMethod      = attribute.Key("rpc.method")           // ShouldRateLimit
	AttrRPCGRPCStatus  = attribute.Key("rpc.grpc.status_code") // the answer's gRPC code, 0 for OK
	AttrHTTPMethod     = attribute.Key("http.request.method")
	AttrHTTPRoute      = attribute.Key("http.route") // /json, /auth/{domain}
	AttrHTTPStatusCode = attribute.Key("http.response.status_code")
)

// ServerOptions returns the gRPC server options of p: each call of a
// method of unary (full names, "/package.Service/Method") gets a server
// span named after the method, a child of the trace context in the call's
// metadata (traceparent, tracestate; baggage); a stream of a method of
// streams only carries that context in its Context, for the spans that the
// stream's handler makes of each message. Other methods (health,
// reflection) are served as without tracing. None when p is off.
func (p *Provider) ServerOptions(unary, streams []string) []grpc.ServerOption {
	if p == nil {
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if !slices.Contains(unary, info.FullMethod) {
				return handler(ctx, req)
			}
			return p.serveUnary(ctx, req, info.FullMethod, handler)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if !slices.Contains(streams, info.FullMethod) {
				return handler(srv, ss)
			}
			return handler(srv, &tracedStream{ServerStream: ss, ctx: p.fromMetadata(ss.Context())})
		}),
	}
}

func (p *Provider) serveUnary(ctx context.Context, req any, method string, handler grpc.UnaryHandler) (any, error) {
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	ctx, span := p.tracer.Start(p.fromMetadata(ctx), strings.TrimPrefix(method, "/"), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(AttrRPCSystem.String("grpc"), AttrRPCService.String(svc), AttrRPCMethod.String(name)))
	defer span.End()
	resp, err := handler(ctx, req)
	code := status.Code(err)
	span.SetAttributes(AttrRPCGRPCStatus.Int(int(code)))
	if serverFault(code) {
		span.SetStatus(codes.Error, code.String())
		span.RecordError(err)
	}
	return resp, err
}

// serverFault reports whether a gRPC code says the server failed, rather
// than the client's request (InvalidArgument, NotFound): OpenTelemetry's
// conventions give a server span the error status for those only.
func serverFault(c grpccodes.Code) bool {
	switch c {
	case grpccodes.Unknown, grpccodes.DeadlineExceeded, grpccodes.Unimplemented, grpccodes.Internal, grpccodes.Unavailable, grpccodes.DataLoss:
		return true
	}
	return false
}

// fromMetadata returns ctx with the trace context and baggage of its
// incoming gRPC metadata.
func (p *Provider) fromMetadata(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	return p.propagator.Extract(ctx, metadataCarrier(md))
}

// tracedStream is a server stream whose Context carries its caller's trace
// context.
type tracedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tracedStream) Context() context.Context { return s.ctx }

// metadataCarrier is gRPC metadata as the propagators read it.
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// Handler returns next with a server span around each request for which
// route returns a route ("" for none: the request is served as without
// tracing), named "METHOD route", a child of the trace context in the
// request's headers (traceparent, tracestate; baggage). next itself when p
// is off.
func (p *Provider) Handler(next http.Handler, route func(*http.Request) string) http.Handler {
	if p == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt := route(r)
		if rt == "" {
			next.ServeHTTP(w, r)
			return
		}
		ctx := p.propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		method, name := httpMethod(r.Method)
		ctx, span := p.tracer.Start(ctx, name+" "+rt, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(AttrHTTPMethod.String(method), AttrHTTPRoute.String(rt)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r.WithContext(ctx))
		span.SetAttributes(AttrHTTPStatusCode.Int(sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

// httpMethod returns the method as a span's attribute and name say it: a
// method of HTTP's own, else "_OTHER" and "HTTP", as OpenTelemetry's
// conventions ask, so that a client's made-up methods (/auth takes any)
// cannot multiply span names.
func httpMethod(m string) (attr, name string) {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m, m
	}
	return "_OTHER", "HTTP"
}

// statusWriter records the status of the answer it writes.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (the JSON
// endpoint stops reading a refused body through it).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
