package redisstore

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

// spanAttrs returns a span's attributes by key, as text.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

// TestTracing: a request under a recorded span makes an rls.redis span of
// its trip, with the sent event; a denial the cache answers makes none and
// marks the caller's span; a request under no recorded span makes none.
func TestTracing(t *testing.T) {
	srv := redistest.Start(t)
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	clock := storetest.NewClock(storetest.T0.Add(10 * time.Second))
	s := newStore(t, Options{URL: srv.URL(), Now: clock.Now, DenyCache: true, Tracer: tracer})
	limit := storetest.Rule(engine.FixedWindow, 1, time.Minute, 0)
	apply := func(ctx context.Context) {
		t.Helper()
		if _, err := s.Apply(ctx, []engine.Item{{Desc: "d/k=a", Rule: limit, Hits: 1}}, make([]engine.Result, 1)); err != nil {
			t.Fatal(err)
		}
	}
	for i, st := range []struct {
		what      string
		traced    bool
		wantTrips int  // rls.redis spans under the caller's
		cacheHit  bool // the caller's span says the cache answered
	}{
		{"admitted", true, 1, false},
		{"denied by Redis", true, 1, false},
		{"denied from the cache", true, 0, true},
		{"no recorded caller", false, 0, false},
	} {
		ctx := context.Background()
		var caller sdktrace.ReadWriteSpan
		if st.traced {
			c, sp := tracer.Start(ctx, "caller")
			ctx, caller = c, sp.(sdktrace.ReadWriteSpan)
		}
		before := len(rec.Ended())
		apply(ctx)
		if caller != nil {
			caller.End()
		}
		var trips []sdktrace.ReadOnlySpan
		for _, sp := range rec.Ended()[before:] {
			if sp.Name() == SpanRedis {
				trips = append(trips, sp)
			}
		}
		if len(trips) != st.wantTrips {
			t.Fatalf("step %d (%s): %d rls.redis spans, want %d", i, st.what, len(trips), st.wantTrips)
		}
		for _, trip := range trips {
			a := spanAttrs(trip)
			if trip.Parent().SpanID() != caller.SpanContext().SpanID() || a[AttrDBSystem] != "redis" || a[AttrMode] != "final" || a[AttrItems] != "1" {
				t.Errorf("step %d (%s): rls.redis parent %s, attributes %v; want the caller's, redis, final, 1 item", i, st.what, trip.Parent().SpanID(), a)
			}
			if ev := trip.Events(); len(ev) != 1 || ev[0].Name != EventSent || ev[0].Time.Before(trip.StartTime()) || ev[0].Time.After(trip.EndTime()) {
				t.Errorf("step %d (%s): events %v, want one %s within the span", i, st.what, ev, EventSent)
			}
		}
		if caller != nil {
			if got := spanAttrs(caller)[AttrDenyCacheHit] == "true"; got != st.cacheHit {
				t.Errorf("step %d (%s): the caller's span says the cache answered: %v, want %v", i, st.what, got, st.cacheHit)
			}
		}
	}
}

// TestTracingCluster: a request whose counters are on several masters
// makes one rls.redis span per master, each naming its node.
func TestTracingCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	s := newStore(t, Options{ClusterSeeds: c.Seeds(), Tracer: tracer})
	limit := storetest.Rule(engine.FixedWindow, 10, time.Minute, 0)
	descs := descsOnDistinctMasters(t, c, s, limit, 2)
	items := []engine.Item{{Desc: descs[0], Rule: limit, Hits: 1}, {Desc: descs[1], Rule: limit, Hits: 1}}
	ctx, caller := tracer.Start(context.Background(), "caller")
	if _, err := s.Apply(ctx, items, make([]engine.Result, 2)); err != nil {
		t.Fatal(err)
	}
	caller.End()
	nodes := map[string]string{} // address → mode
	for _, sp := range rec.Ended() {
		if sp.Name() == SpanRedis {
			a := spanAttrs(sp)
			nodes[a[AttrServerAddress]] = a[AttrMode]
		}
	}
	want := map[string]string{}
	for _, d := range descs {
		want[c.Master(c.KeySlot(s.base(&engine.Item{Desc: d, Rule: limit}))).Addr()] = "reserve"
	}
	if len(nodes) != 2 || nodes[""] != "" {
		t.Fatalf("rls.redis spans by node: %v, want one per master %v", nodes, want)
	}
	for addr, mode := range want {
		if nodes[addr] != mode {
			t.Errorf("rls.redis spans by node: %v, want %v", nodes, want)
		}
	}
}
