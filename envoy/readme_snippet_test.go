package envoy_test

import (
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/rlsproject/rls/internal/config"
)

// TestREADMETokenBudgetRoute checks the README's Envoy route for LLM token
// budgets: a route's typed_per_filter_config (Envoy 1.40's protos and
// validation rules) whose RateLimitPerRoute, where alone Envoy sends a
// per-descriptor hits_addend, checks one hit on the request and charges
// the tokens of the dynamic metadata when the stream ends.
func TestREADMETokenBudgetRoute(t *testing.T) {
	check, charge := readmeTwoCalls(t, "# Envoy route: a check of 1 hit at the request")
	if check.GetApplyOnStreamDone() || check.GetHitsAddend() != nil {
		t.Errorf("the check %v: want one hit on the request path", check)
	}
	if !charge.GetApplyOnStreamDone() || !strings.HasPrefix(charge.GetHitsAddend().GetFormat(), "%DYNAMIC_METADATA(") {
		t.Errorf("the charge %v: want the metadata's tokens when the stream ends", charge)
	}
}

// TestREADMEMetadataLimitRoute checks the README's Envoy route that sends
// a request's own limit from dynamic metadata (what Envoy Gateway's
// fromMetadata generates), beside rls's runtime overrides: an Envoy Route
// (Envoy 1.40's protos and validation rules) whose rate limit takes its
// limit from a metadata key and its descriptor from a header.
func TestREADMEMetadataLimitRoute(t *testing.T) {
	route := readmeRoute(t, "# Envoy route: each tenant's limit read from dynamic metadata")
	if err := route.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	limits := route.GetRoute().GetRateLimits()
	if len(limits) != 1 {
		t.Fatalf("the route has %d rate_limits, want 1", len(limits))
	}
	md := limits[0].GetLimit().GetDynamicMetadata().GetMetadataKey()
	if md.GetKey() == "" || len(md.GetPath()) == 0 {
		t.Errorf("the rate limit's limit %v: want a dynamic metadata key and path", limits[0].GetLimit())
	}
	if h := limits[0].GetActions()[0].GetRequestHeaders(); h.GetDescriptorKey() != "tenant" {
		t.Errorf("the descriptor %v: want the tenant from a header", limits[0].GetActions())
	}
}

// readmeTwoCalls returns the two rate_limits of the RateLimitPerRoute of
// the README's route that starts with head, valid by Envoy's rules: the
// request's call, and the call when the stream ends.
func readmeTwoCalls(t *testing.T, head string) (request, streamDone *routev3.RateLimit) {
	t.Helper()
	route := readmeRoute(t, head)
	per := unpack[*ratelimitv3.RateLimitPerRoute](t, route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"])
	if err := per.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	limits := per.GetRateLimits()
	if len(limits) != 2 {
		t.Fatalf("the route %q...: RateLimitPerRoute has %d rate_limits, want the request's call and the stream's end", head, len(limits))
	}
	return limits[0], limits[1]
}

// readmeRoute returns the Envoy Route of the README's yaml block that
// starts with the comment line head, read with Envoy's protos (strict
// proto3 JSON: an unknown field fails).
func readmeRoute(t *testing.T, head string) *routev3.Route {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```yaml\n"+head)
	if !ok {
		t.Fatalf("README.md has no yaml block starting %q", head)
	}
	block, _, _ := strings.Cut(head+rest, "```")
	js, err := yaml.YAMLToJSON([]byte(block))
	if err != nil {
		t.Fatal(err)
	}
	route := &routev3.Route{}
	if err := protojson.Unmarshal(js, route); err != nil {
		t.Fatalf("the README's route snippet is not an Envoy Route: %v\n%s", err, block)
	}
	return route
}

// TestREADMETokenReserveRoute checks the README's Envoy route for token
// budgets that reserve: a RateLimitPerRoute (Envoy 1.40's protos and
// validation rules) whose first item, on the request, sends the tenant
// and the request's x-request-id with no hits_addend (the call holds the
// configured estimate), and whose second, when the stream ends, sends the
// very same descriptor with the tokens of the dynamic metadata (the
// settle). The descriptor reaches, in config/examples/llm.yaml once the
// domain's reservation_key entry is taken out, limits that reserve; and a
// request without an id sends no descriptor (it would be charged, not
// reserved).
func TestREADMETokenReserveRoute(t *testing.T) {
	reserve, settle := readmeTwoCalls(t, "# Envoy route: reserve an estimate at the request")
	if reserve.GetApplyOnStreamDone() || reserve.GetHitsAddend() != nil {
		t.Errorf("the reserve %v: want the request's call, no hits_addend (the estimate is held)", reserve)
	}
	if !settle.GetApplyOnStreamDone() || !strings.HasPrefix(settle.GetHitsAddend().GetFormat(), "%DYNAMIC_METADATA(") || settle.GetHitsAddend().GetIsNegativeHits() {
		t.Errorf("the settle %v: want the metadata's tokens when the stream ends", settle)
	}

	limitsCfg, err := config.Load("../config/examples/llm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dom := limitsCfg.Domain("llm")
	if dom == nil || dom.ReservationKey == "" {
		t.Fatalf("config/examples/llm.yaml: domain llm %v, want one with a reservation_key", dom)
	}
	with := sampleRequest{netip.MustParseAddr("203.0.113.7"), map[string]string{"x-tenant": "acme", "x-request-id": "5f0c2b1e-8d1a-4b7e-9c55-2f3e1a0b6d42"}}
	got, ok := envoyDescriptor(t, reserve, with)
	if again, ok2 := envoyDescriptor(t, settle, with); !ok || !ok2 || !reflect.DeepEqual(got, again) {
		t.Fatalf("reserve sends %v (%v), settle %v (%v): a settle must name the reserved id and counters", got, ok, again, ok2)
	}
	var counted []config.Entry
	id := ""
	for _, e := range got {
		if e.Key == dom.ReservationKey {
			id = e.Value
			continue
		}
		counted = append(counted, e)
	}
	if id != with.headers["x-request-id"] {
		t.Errorf("descriptor %v: the %s entry is %q, want the request's x-request-id", got, dom.ReservationKey, id)
	}
	n := dom.Match(counted)
	if n == nil || len(n.Limits) == 0 {
		t.Fatalf("descriptor %v (without %s) reaches no limit of config/examples/llm.yaml", counted, dom.ReservationKey)
	}
	for _, l := range n.Limits {
		if l.Rule == nil || l.Rule.Reserve == nil {
			t.Errorf("descriptor %v: limit %s does not reserve", counted, l.Label)
		}
	}
	without := sampleRequest{netip.MustParseAddr("203.0.113.7"), map[string]string{"x-tenant": "acme"}}
	if d, ok := envoyDescriptor(t, reserve, without); ok {
		t.Errorf("without x-request-id the reserve sends %v: want no descriptor (it would be charged, never settled)", d)
	}
}
