package envoy_test

import (
	"net/netip"
	"os"
	"reflect"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

const concurrencyLimits = "../config/examples/concurrency.yaml"

// TestConcurrencyConfig checks envoy-concurrency.yaml, the README's
// example of a limit of requests in flight: a valid bootstrap (Envoy
// 1.40's protos and rules) whose limited route, in its RateLimitPerRoute
// (where alone Envoy sends a per-descriptor hits_addend), acquires on the
// request and releases the very same descriptor with one negative hit when
// the stream ends; the descriptor reaches, in the filter's domain of
// config/examples/concurrency.yaml, a node whose only limit is a
// concurrency one that counts denied hits (Envoy releases denied requests
// too, and a release gives hits back to every limit of its node).
func TestConcurrencyConfig(t *testing.T) {
	data, err := os.ReadFile("envoy-concurrency.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := validateYAML("envoy-concurrency.yaml", data)
	if err != nil {
		t.Fatalf("envoy-concurrency.yaml is not a valid Envoy bootstrap:\n%v", err)
	}
	h := hcm(t, listenerNamed(t, bs, "concurrency"))
	filter := httpFilter[*ratelimitv3.RateLimit](t, h)
	limits, err := config.Load(concurrencyLimits)
	if err != nil {
		t.Fatal(err)
	}
	dom := limits.Domain(filter.GetDomain())
	if dom == nil {
		t.Fatalf("the filter's domain %q is not in %s", filter.GetDomain(), concurrencyLimits)
	}

	var route *routev3.Route
	for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			if rt.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"] != nil {
				route = rt
			}
		}
	}
	if route == nil {
		t.Fatal("no route has a RateLimitPerRoute")
	}
	per := unpack[*ratelimitv3.RateLimitPerRoute](t, route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"])
	var acquire, release *routev3.RateLimit
	for _, rl := range per.GetRateLimits() {
		switch a := rl.GetHitsAddend(); {
		case !rl.GetApplyOnStreamDone() && (a == nil || a.GetNumber().GetValue() == 1 && !a.GetIsNegativeHits()):
			acquire = rl
		case rl.GetApplyOnStreamDone() && a.GetNumber().GetValue() == 1 && a.GetIsNegativeHits() && a.GetFormat() == "":
			release = rl
		default:
			t.Errorf("a rate_limits item that neither acquires nor releases: %v", rl)
		}
	}
	if acquire == nil || release == nil {
		t.Fatalf("RateLimitPerRoute: acquire %v, release %v; want one of each", acquire, release)
	}

	with := sampleRequest{netip.MustParseAddr("203.0.113.7"), map[string]string{":method": "POST", ":path": "/upload", "x-tenant": "acme"}}
	without := sampleRequest{netip.MustParseAddr("203.0.113.7"), map[string]string{":method": "POST", ":path": "/upload"}}
	got, ok := envoyDescriptor(t, acquire, with)
	if again, ok2 := envoyDescriptor(t, release, with); !ok || !ok2 || !reflect.DeepEqual(got, again) {
		t.Fatalf("acquire sends %v (%v), release %v (%v): a release must name the acquired counter", got, ok, again, ok2)
	}
	_, ok = envoyDescriptor(t, acquire, without)
	if _, ok2 := envoyDescriptor(t, release, without); ok || ok2 {
		t.Errorf("without x-tenant: acquire %v, release %v; want neither", ok, ok2)
	}
	n := dom.Match(got)
	if n == nil || len(n.Limits) != 1 {
		t.Fatalf("descriptor %v reaches %v in %s, want a node with one limit", got, n, concurrencyLimits)
	}
	l := n.Limits[0]
	if l.Rule == nil || l.Rule.Algorithm() != engine.Concurrency || !l.CountDeniedHits {
		t.Errorf("descriptor %v: limit %s, want algorithm concurrency with count_denied_hits", got, l.Label)
	}
}
