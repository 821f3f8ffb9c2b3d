package spans

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestSpans: Start makes a span of the kind asked, child of ctx's;
// Child makes one only under a recorded span; a sampled-out span is none
// but still carried in ctx, so that its parts make none; End marks a
// failure with the error status and a bounded exception event.
func TestSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(rec)).Tracer("test")
	bg := context.Background()

	// Step 1: a root server span, and a child that fails.
	ctx, root := Start(bg, tracer, "root", trace.SpanKindServer)
	if !root.Recording() {
		t.Fatal("step 1: Start(tracer) made no recorded span")
	}
	root.Set(attribute.Int("n", 1))
	_, child := Child(ctx, tracer, "child", trace.SpanKindInternal)
	long := errors.New(strings.Repeat("é", 300))
	child.End(long)
	root.End(nil)
	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("step 1: %d spans ended, want 2", len(ended))
	}
	c, r := ended[0], ended[1]
	if r.Name() != "root" || r.SpanKind() != trace.SpanKindServer || r.Status().Code != codes.Unset || len(r.Attributes()) != 1 {
		t.Errorf("step 1: root %s %v %v %v, want a server span, unset status, its attribute", r.Name(), r.SpanKind(), r.Status(), r.Attributes())
	}
	if c.Name() != "child" || c.Parent().SpanID() != r.SpanContext().SpanID() || c.SpanKind() != trace.SpanKindInternal {
		t.Errorf("step 1: child %s of %s (%v), want the root's internal child", c.Name(), c.Parent().SpanID(), c.SpanKind())
	}
	ev := c.Events()
	if c.Status().Code != codes.Error || len(c.Status().Description) > MaxString || len(ev) != 1 || ev[0].Name != "exception" {
		t.Fatalf("step 1: failed child: status %v, events %v; want the error status and one exception event, bounded", c.Status(), ev)
	}
	got := map[attribute.Key]string{}
	for _, a := range ev[0].Attributes {
		got[a.Key] = a.Value.String()
	}
	if got["exception.type"] != "*errors.errorString" || got["exception.message"] != Bound(long.Error()) {
		t.Errorf("step 1: exception event %v, want the error's type and its bounded message", got)
	}

	// Step 2: no recorded span in ctx: Child makes none.
	if _, s := Child(bg, tracer, "orphan", trace.SpanKindClient); s.Recording() {
		t.Error("step 2: Child under no span made one")
	}
	// Step 3: a sampled-out span is none, and its parts make none.
	ctx, out := Start(bg, unsampled, "out", trace.SpanKindInternal)
	_, part := Child(ctx, tracer, "part", trace.SpanKindInternal)
	if out.Recording() || part.Recording() || !trace.SpanFromContext(ctx).SpanContext().IsValid() {
		t.Errorf("step 3: sampled out: recorded %v, its part %v; want none, the unrecorded span still in ctx", out.Recording(), part.Recording())
	}
	out.End(long)
	if n := len(rec.Ended()); n != 2 {
		t.Errorf("step 3: %d spans ended, want still 2", n)
	}
}

// TestNoTracerCostsNothing: without a tracer, a span's whole life
// allocates nothing.
func TestNoTracerCostsNothing(t *testing.T) {
	err := errors.New("x")
	n := testing.AllocsPerRun(100, func() {
		ctx, s := Start(context.Background(), nil, "a", trace.SpanKindServer)
		_, c := Child(ctx, nil, "b", trace.SpanKindClient)
		if c.Recording() {
			c.Set(attribute.Int("n", 1))
		}
		c.End(err)
		s.End(nil)
	})
	if n != 0 {
		t.Errorf("no tracer: %v allocations, want 0", n)
	}
}

func TestBound(t *testing.T) {
	for _, tc := range []struct {
		in      string
		wantLen int // in bytes
	}{
		{"short", 5},
		{strings.Repeat("a", MaxString), MaxString},
		{strings.Repeat("a", MaxString+1), MaxString},
		{strings.Repeat("é", MaxString), MaxString - 1}, // 2-byte runes: the cut falls inside one
	} {
		got := Bound(tc.in)
		if len(got) != tc.wantLen || !utf8.ValidString(got) || (len(tc.in) > MaxString) != strings.HasSuffix(got, "…") {
			t.Errorf("Bound(%d bytes) = %d bytes %q, want %d bytes, valid UTF-8, \"…\" when cut", len(tc.in), len(got), got, tc.wantLen)
		}
	}
}
