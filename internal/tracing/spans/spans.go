// Package spans makes the spans of rls's own operations (a decision, its
// match and store call, a Redis trip, an RLQS report) with OpenTelemetry's
// API only: one way to start a span, to say what it found and how it
// failed, that costs nothing when tracing is off. It knows nothing of rate
// limiting, and nothing of the SDK that exports the spans (internal/tracing
// sets that up).
package spans

import (
	"context"
	"fmt"
	"reflect"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span is an operation's span being recorded, or none: the zero Span,
// which Start and Child return when the tracer is nil or the span is not
// recorded, does nothing at no cost. A value, safe to copy; its methods
// are safe for concurrent use as the span they wrap is.
type Span struct{ span trace.Span }

// Start starts a span called name of kind when tracer is not nil: a child
// of ctx's span, or a root when ctx carries none. It returns ctx with the
// span in it, also when the sampler left the span out (so that what the
// operation leads to is left out too; see Child), and the span, none when
// it is not recorded.
func Start(ctx context.Context, tracer trace.Tracer, name string, kind trace.SpanKind) (context.Context, Span) {
	if tracer == nil {
		return ctx, Span{}
	}
	var s trace.Span
	if kind == trace.SpanKindInternal {
		ctx, s = tracer.Start(ctx, name) // internal is the default: no option to build
	} else {
		ctx, s = tracer.Start(ctx, name, trace.WithSpanKind(kind))
	}
	if !s.IsRecording() {
		return ctx, Span{}
	}
	return ctx, Span{s}
}

// Child is Start for the part of an operation whose span is in ctx: it
// starts a span only when ctx carries a recorded one. A call that no
// recorded span led to (a sampled-out request, a debug explanation) makes
// none, and no orphan root.
func Child(ctx context.Context, tracer trace.Tracer, name string, kind trace.SpanKind) (context.Context, Span) {
	if tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, Span{}
	}
	return Start(ctx, tracer, name, kind)
}

// Recording reports whether s is a span being recorded. What its
// attributes cost to build (the variadic slice of Set escapes) is spent
// under it.
func (s Span) Recording() bool { return s.span != nil }

// Set sets attributes of s. Call it under Recording on a hot path: its
// arguments are built by the caller even for none.
func (s Span) Set(kv ...attribute.KeyValue) {
	if s.span != nil {
		s.span.SetAttributes(kv...)
	}
}

// Trace returns the span itself, for an event added later by another part
// of the program (a Redis pipeline that says when it was sent); nil for
// none.
func (s Span) Trace() trace.Span { return s.span }

// End ends s. A non-nil err marks it failed: the error status and an
// "exception" event, with exception.type (the error's Go type) and
// exception.message, as OpenTelemetry's conventions say, the message cut
// by Bound (an error may carry what a client sent).
func (s Span) End(err error) {
	if s.span == nil {
		return
	}
	if err != nil {
		msg := Bound(err.Error())
		s.span.AddEvent("exception", trace.WithAttributes(
			attrExceptionType.String(typeName(err)), attrExceptionMessage.String(msg)))
		s.span.SetStatus(codes.Error, msg)
	}
	s.span.End()
}

// The attributes of the exception event (OpenTelemetry's semantic
// conventions).
const (
	attrExceptionType    = attribute.Key("exception.type")
	attrExceptionMessage = attribute.Key("exception.message")
)

// typeName names err's Go type as exception.type does: the package path
// and the name of a named type, else the type as Go writes it
// ("*errors.errorString").
func typeName(err error) string {
	t := reflect.TypeOf(err)
	if t.Name() == "" {
		return t.String()
	}
	return fmt.Sprintf("%s.%s", t.PkgPath(), t.Name())
}

// MaxString bounds a string that Bound lets into a span.
const MaxString = 256

// Bound is s cut to MaxString bytes, on a UTF-8 boundary, with "…" when
// cut: what a client sends may be long (a span export of a megabyte
// attribute is dropped whole).
func Bound(s string) string {
	if len(s) <= MaxString {
		return s
	}
	cut := MaxString - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
