// Package otlptest is an OTLP trace receiver for tests: it listens on
// 127.0.0.1 over gRPC (the TraceService of
// opentelemetry.proto.collector.trace.v1) and over HTTP (POST /v1/traces,
// protobuf bodies), and keeps the spans it is sent, flattened, for the test
// to read. It knows nothing of rls.
package otlptest

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened: ids in lower-case hex (ParentID ""
// for a root), attributes and the resource's attributes as text.
type Span struct {
	Name            string
	TraceID, SpanID string
	ParentID        string
	Kind            tracepb.Span_SpanKind
	Attrs           map[string]string
	Resource        map[string]string
	Scope           string
	StatusCode      tracepb.Status_StatusCode
	StatusMessage   string
	Events          []string // names
	Start, End      time.Time
	ViaHTTP         bool // sent over OTLP/HTTP, not gRPC
}

func (s Span) String() string {
	return fmt.Sprintf("%s (trace %s, span %s, parent %q, %v, status %v %q)", s.Name, s.TraceID, s.SpanID, s.ParentID, s.Attrs, s.StatusCode, s.StatusMessage)
}

// Receiver is a running receiver, stopped when its test ends. Its methods
// are safe for concurrent use.
type Receiver struct {
	grpcAddr, httpAddr string
	mu                 sync.Mutex
	spans              []Span
	exports            int
	changed            chan struct{} // closed and replaced at each export
}

// Start starts a receiver on two free loopback ports, in plain text.
func Start(tb testing.TB) *Receiver {
	tb.Helper()
	return StartTLS(tb, nil)
}

// StartTLS starts a receiver whose two listeners serve TLS with cfg (nil:
// plain text).
func StartTLS(tb testing.TB, cfg *tls.Config) *Receiver {
	tb.Helper()
	r := &Receiver{changed: make(chan struct{})}
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		glis.Close()
		tb.Fatal(err)
	}
	r.grpcAddr, r.httpAddr = glis.Addr().String(), hlis.Addr().String()
	var opts []grpc.ServerOption
	if cfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
		hlis = tls.NewListener(hlis, cfg)
	}
	gs := grpc.NewServer(opts...)
	collectorpb.RegisterTraceServiceServer(gs, &traceService{r: r})
	hs := &http.Server{Handler: http.HandlerFunc(r.serveHTTP), ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { gs.Serve(glis) })
	wg.Go(func() { hs.Serve(hlis) })
	tb.Cleanup(func() {
		gs.Stop()
		hs.Close()
		wg.Wait()
	})
	return r
}

// GRPCAddr is the gRPC receiver's host:port.
func (r *Receiver) GRPCAddr() string { return r.grpcAddr }

// HTTPAddr is the HTTP receiver's host:port (spans at POST /v1/traces).
func (r *Receiver) HTTPAddr() string { return r.httpAddr }

// Spans returns the spans received so far, in the order they came.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Exports returns how many export requests came.
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// WaitFor waits, up to timeout, until the spans received satisfy ok, and
// returns them; past the timeout it fails the test with what came.
func (r *Receiver) WaitFor(tb testing.TB, timeout time.Duration, what string, ok func([]Span) bool) []Span {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans, changed := append([]Span(nil), r.spans...), r.changed
		r.mu.Unlock()
		if ok(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("after %s the receiver has not got %s; it got %d spans:\n%s", timeout, what, len(spans), Format(spans))
			return nil
		}
	}
}

// Format lists spans one per line, for failure messages.
func Format(spans []Span) string {
	var b strings.Builder
	for _, s := range spans {
		b.WriteString("  " + s.String() + "\n")
	}
	return b.String()
}

// Named returns the spans called name.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func (r *Receiver) add(req *collectorpb.ExportTraceServiceRequest, viaHTTP bool) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Name:          s.GetName(),
					TraceID:       hex.EncodeToString(s.GetTraceId()),
					SpanID:        hex.EncodeToString(s.GetSpanId()),
					ParentID:      hex.EncodeToString(s.GetParentSpanId()),
					Kind:          s.GetKind(),
					Attrs:         attrs(s.GetAttributes()),
					Resource:      res,
					Scope:         ss.GetScope().GetName(),
					StatusCode:    s.GetStatus().GetCode(),
					StatusMessage: s.GetStatus().GetMessage(),
					Start:         time.Unix(0, int64(s.GetStartTimeUnixNano())),
					End:           time.Unix(0, int64(s.GetEndTimeUnixNano())),
					ViaHTTP:       viaHTTP,
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, e.GetName())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, got...)
	r.exports++
	close(r.changed)
	r.changed = make(chan struct{})
}

// attrs renders attributes as text: strings as they are, other values as
// Go prints them.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
		default:
			m[kv.GetKey()] = fmt.Sprint(v)
		}
	}
	return m
}

type traceService struct {
	collectorpb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s *traceService) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	s.r.add(req, false)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// serveHTTP is OTLP/HTTP's trace endpoint, protobuf bodies only.
func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "content type "+ct+": only application/x-protobuf", http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
	if err == nil && req.Header.Get("Content-Encoding") != "" {
		err = errors.New("compressed bodies are not supported")
	}
	var msg collectorpb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &msg)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg, true)
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}
