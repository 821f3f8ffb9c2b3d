package compat

import (
	"context"
	"reflect"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/service"
)

// quotaRoutingConfig is the reference's example of routing by quota
// (examples/ratelimit/config/example.yaml, its /multiservice-tokenquota
// route), with descriptors whose metadata an answer must leave out
// (unlimited) or merge key by key (nested).
const quotaRoutingConfig = `
domain: d
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: service_1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota: {name: service_2}
  - key: free
    rate_limit: {unlimited: true}
    metadata: {unlimited_hint: yes}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
    metadata: {nested: {x: 1}, flat: first}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 10}
    metadata: {nested: {x: 2, y: 2}, flat: second, other: 3}
`

// metadataPath is what Envoy's %DYNAMIC_METADATA(ns:k1:k2:…)% reads of the
// ratelimit filter's namespace: the answer's dynamic metadata as the gRPC
// server sends it, then the path; "" when it is not there.
func metadataPath(t *testing.T, md map[string]any, path ...string) string {
	t.Helper()
	st, err := structpb.NewStruct(md)
	if err != nil {
		t.Fatalf("the dynamic metadata %v is not a proto Struct: %v", md, err)
	}
	v := structpb.NewStructValue(st)
	for _, k := range path {
		v = v.GetStructValue().GetFields()[k]
	}
	return v.GetStringValue()
}

// The reference nests the passed descriptors' metadata under "metadata",
// beside the request's domain, descriptors and hits_addend: Envoy's
// metadata:service_with_quota:name lookup of its /multiservice-tokenquota
// route found nothing when rls put it at the top level, and requests went
// to the wrong backend.
func TestDynamicMetadataAsReference(t *testing.T) {
	// Denied hits count, as in the mode (and the reference).
	svc, _ := newReferenceServiceFrom(t, quotaRoutingConfig, service.Options{CountDeniedHits: true}, ref{noStats: true, answers: Answers{DynamicMetadata: true}}, 2)
	look := func(v string) service.Descriptor {
		d := desc("service", v)
		d.HasHits = true // the request path: hits_addend 0, a look
		return d
	}
	route := func() string {
		t.Helper()
		resp := ask(t, svc, 1, look("service_1"), look("service_2"))
		return metadataPath(t, resp.Metadata, "metadata", "service_with_quota", "name")
	}
	if got := route(); got != "service_1" {
		t.Errorf("both services with quota: metadata:service_with_quota:name = %q, want service_1 (the first that passed)", got)
	}
	// The response path charges service_1 twice: it is past its quota.
	for range 2 {
		ask(t, svc, 1, desc("service", "service_1"))
	}
	if got := route(); got != "service_2" {
		t.Errorf("service_1 out of quota: metadata:service_with_quota:name = %q, want service_2", got)
	}

	// The whole of it, as the reference's ratelimitToMetadata builds it.
	over := desc("a", "x")
	over.Override = &service.Override{RequestsPerUnit: 10, Unit: engine.Minute}
	counted := desc("b", "y")
	counted.HasHits, counted.Hits = true, 2
	resp, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "d", HitsAddend: 3,
		Descriptors: []service.Descriptor{desc("free", "f"), desc("a", "x"), counted, over}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"domain":     "d",
		"hitsAddend": float64(3),
		"descriptors": []any{
			map[string]any{"entries": []any{"free=f"}},
			map[string]any{"entries": []any{"a=x"}},
			map[string]any{"entries": []any{"b=y"}, "hitsAddend": float64(2)},
			map[string]any{"entries": []any{"a=x"}, "limit": "requests_per_unit:10 unit:MINUTE"},
		},
		// Not the unlimited descriptor's, nor the override's; a's first,
		// b's merged into its maps.
		"metadata": map[string]any{"nested": map[string]any{"x": float64(1), "y": float64(2)}, "flat": "first", "other": float64(3)},
	}
	if !reflect.DeepEqual(resp.Metadata, want) {
		t.Errorf("dynamic metadata\n got %v\nwant %v", resp.Metadata, want)
	}
	// Merging copied: the config's metadata is as it was.
	again, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "d", Descriptors: []service.Descriptor{desc("a", "x")}})
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Metadata["metadata"]; !reflect.DeepEqual(got, map[string]any{"nested": map[string]any{"x": float64(1)}, "flat": "first"}) {
		t.Errorf("a alone after a merge: metadata %v, want a's own", got)
	}

	// A domain the config lacks: OK, and still the request's metadata.
	unknown, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "nope", Descriptors: []service.Descriptor{desc("k", "v")}})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"domain": "nope", "descriptors": []any{map[string]any{"entries": []any{"k=v"}}}}; !reflect.DeepEqual(unknown.Metadata, want) {
		t.Errorf("unknown domain: dynamic metadata %v, want %v", unknown.Metadata, want)
	}
}
