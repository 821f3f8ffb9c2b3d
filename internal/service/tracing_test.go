package service

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/memstore"
)

// recorder returns a tracer whose ended spans rec holds.
func recorder() (trace.Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	return tp.Tracer("test"), rec
}

// attrsOf returns a span's attributes by key, as text.
func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

// byName returns the ended spans called name.
func byName(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Each decision is an rls.decide span, child of the caller's, with
// rls.match and rls.store children carrying the documented attributes.
func TestDecisionSpans(t *testing.T) {
	tracer, rec := recorder()
	f := newFixture(t, Options{Tracer: tracer, StoreName: "memory"})
	ctx, caller := tracer.Start(context.Background(), "caller")
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "k1"), desc("nothing", "here")}}
	for i, want := range []Code{OK, OK, OverLimit} { // per_key: 2 an hour
		resp, err := f.svc.ShouldRateLimit(ctx, req)
		if err != nil || resp.Code != want {
			t.Fatalf("request %d: %v, %v; want %s", i, resp, err, want)
		}
	}
	if _, err := f.svc.CheckHTTP(ctx, "api", httpReq{addr: "192.0.2.9"}); err != nil {
		t.Fatal(err)
	}
	caller.End()

	decides, matches, stores := byName(rec, SpanDecide), byName(rec, SpanMatch), byName(rec, SpanStore)
	if len(decides) != 4 || len(matches) != 4 || len(stores) != 4 {
		t.Fatalf("%d rls.decide, %d rls.match, %d rls.store spans; want 4 of each (3 ShouldRateLimit, 1 CheckHTTP)", len(decides), len(matches), len(stores))
	}
	for i, d := range decides {
		a := attrsOf(d)
		wantCode, wantDescs := []string{"OK", "OK", "OVER_LIMIT", "OK"}[i], []string{"2", "2", "2", "1"}[i]
		if d.Parent().SpanID() != caller.SpanContext().SpanID() || a[AttrDomain] != "api" || a[AttrDescriptors] != wantDescs || a[AttrCode] != wantCode {
			t.Errorf("rls.decide %d: parent %s, attributes %v; want parent the caller's %s, domain api, %s descriptors, code %s",
				i, d.Parent().SpanID(), a, caller.SpanContext().SpanID(), wantDescs, wantCode)
		}
		m, st := matches[i], stores[i]
		if m.Parent().SpanID() != d.SpanContext().SpanID() || st.Parent().SpanID() != d.SpanContext().SpanID() {
			t.Errorf("decision %d: rls.match and rls.store are not children of its rls.decide", i)
		}
		if am := attrsOf(m); i < 3 && (am[AttrDescriptors] != "2" || am[AttrUnmatched] != "1") {
			t.Errorf("rls.match %d: %v, want 2 descriptors, 1 unmatched (nothing=here)", i, am)
		}
		wantAdmitted := []string{"true", "true", "false", "true"}[i]
		if as := attrsOf(st); as[AttrStore] != "memory" || as[AttrAdmitted] != wantAdmitted || (i < 3 && as[AttrItems] != "1") {
			t.Errorf("rls.store %d: %v, want store memory, 1 item, admitted %s", i, as, wantAdmitted)
		}
		if d.Status().Code != codes.Unset || st.Status().Code != codes.Unset {
			t.Errorf("decision %d: statuses %v, %v; want unset (a denial is no error)", i, d.Status(), st.Status())
		}
	}
}

// A failed store call marks the store span and, under --on-store-error
// error, the decision's span as errors; under allow, only the store's.
func TestDecisionSpansStoreError(t *testing.T) {
	storeErr := errors.New("redis: connection refused")
	for _, policy := range []StoreErrorPolicy{FailError, FailAllow} {
		tracer, rec := recorder()
		f := newFixture(t, Options{Tracer: tracer, StoreName: "redis", Store: failingStore{storeErr}, OnStoreError: policy})
		_, err := f.svc.ShouldRateLimit(context.Background(), &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "k1")}})
		if (err != nil) != (policy == FailError) {
			t.Fatalf("%s: err = %v", policy, err)
		}
		d, st := byName(rec, SpanDecide), byName(rec, SpanStore)
		if len(d) != 1 || len(st) != 1 {
			t.Fatalf("%s: %d rls.decide, %d rls.store spans; want 1 and 1", policy, len(d), len(st))
		}
		if st[0].Status().Code != codes.Error || len(st[0].Events()) == 0 || st[0].Events()[0].Name != "exception" {
			t.Errorf("%s: rls.store status %v, events %v; want the error status and the error as an exception event", policy, st[0].Status(), st[0].Events())
		}
		wantDecide := codes.Unset
		if policy == FailError {
			wantDecide = codes.Error
		}
		if d[0].Status().Code != wantDecide {
			t.Errorf("%s: rls.decide status %v, want %v", policy, d[0].Status(), wantDecide)
		}
		if policy == FailAllow && attrsOf(d[0])[AttrCode] != "OK" {
			t.Errorf("allow: rls.decide attributes %v, want code OK", attrsOf(d[0]))
		}
	}
}

// benchDecisions measures ShouldRateLimit of one descriptor that three
// limits judge on the memory store, on a service configured by opts (its
// store aside), told to an observer that does nothing (rls's metrics are
// measured in internal/decisionmetrics). The third limit (an hour's
// sliding window) admits perHour hits: a billion admits everything, 1
// denies every request after the first.
func benchDecisions(b *testing.B, opts Options, perHour uint32) {
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: %d, algorithm: sliding_window}
`, perHour)))
	if err != nil {
		b.Fatal(err)
	}
	ms := memstore.New(memstore.Options{})
	b.Cleanup(func() { ms.Close() })
	opts.Store, opts.Observers = ms, []Observer{nopObserver{}}
	svc := New(opts)
	svc.SetConfig(cfg)
	req := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1")}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkShouldRateLimitTracing is BenchmarkShouldRateLimit with tracing
// off (no tracer: what the daemon runs without --otlp-endpoint), on with
// every trace sampled (spans made and handed to a processor that drops
// them, so that the export's cost is not counted), and on with none
// sampled (a caller that did not sample its trace).
func BenchmarkShouldRateLimitTracing(b *testing.B) {
	for _, bc := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: no tracer
	}{
		{"off", nil},
		{"on", sdktrace.AlwaysSample()},
		{"unsampled", sdktrace.NeverSample()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var opts Options
			if bc.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(bc.sampler), sdktrace.WithSpanProcessor(dropProcessor{}))
				opts.Tracer, opts.StoreName = tp.Tracer("bench"), "memory"
			}
			benchDecisions(b, opts, 1e9)
		})
	}
}

// nopObserver is told everything and does nothing.
type nopObserver struct{}

func (nopObserver) ForConfig(*config.Config) any { return nil }
func (nopObserver) Reloaded(error)               {}
func (nopObserver) Decided(any, *Decision)       {}
func (nopObserver) Cleared(any, *Cleared)        {}

// dropProcessor takes ended spans and keeps nothing.
type dropProcessor struct{}

func (dropProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (dropProcessor) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (dropProcessor) Shutdown(context.Context) error                  { return nil }
func (dropProcessor) ForceFlush(context.Context) error                { return nil }
