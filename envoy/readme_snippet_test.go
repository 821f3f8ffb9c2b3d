package envoy_test

import (
	"os"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// TestREADMETokenBudgetRoute checks the README's Envoy route for LLM token
// budgets: a route's typed_per_filter_config (Envoy 1.40's protos and
// validation rules) whose RateLimitPerRoute, where alone Envoy sends a
// per-descriptor hits_addend, checks one hit on the request and charges
// the tokens of the dynamic metadata when the stream ends.
func TestREADMETokenBudgetRoute(t *testing.T) {
	route := readmeRoute(t, "# Envoy route: a check of 1 hit at the request")
	per := unpack[*ratelimitv3.RateLimitPerRoute](t, route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"])
	if err := per.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	limits := per.GetRateLimits()
	if len(limits) != 2 {
		t.Fatalf("RateLimitPerRoute has %d rate_limits, want the check and the charge", len(limits))
	}
	check, charge := limits[0], limits[1]
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
