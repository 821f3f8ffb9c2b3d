package envoy_test

import (
	"os"
	"testing"
	"time"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/rlsproject/rls/internal/config"
)

// TestRLQSConfig checks envoy-rlqs.yaml, the example of Envoy's quota
// filter on rls: a valid bootstrap (Envoy 1.40's protos and rules), whose
// filter names a domain of config/limits.yaml, builds bucket ids whose
// keys name a descriptor with limits there, and falls back to DENY_ALL
// when an assignment expires, for a time (what the README's bound
// assumes: unset, expired_assignment_behavior_timeout is 0 and Envoy
// goes back to no_assignment_behavior, ALLOW_ALL, at once).
func TestRLQSConfig(t *testing.T) {
	data, err := os.ReadFile("envoy-rlqs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := validateYAML("envoy-rlqs.yaml", data)
	if err != nil {
		t.Fatalf("envoy-rlqs.yaml is not a valid Envoy bootstrap:\n%v", err)
	}
	f := httpFilter[*rlqsfilterv3.RateLimitQuotaFilterConfig](t, hcm(t, listenerNamed(t, bs, "quota")))
	limits, err := config.Load(limitsFile)
	if err != nil {
		t.Fatal(err)
	}
	dom := limits.Domain(f.GetDomain())
	if dom == nil {
		t.Fatalf("the filter's domain %q is not in %s", f.GetDomain(), limitsFile)
	}
	if f.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "rls" {
		t.Errorf("rlqs_server: %v, want the cluster rls", f.GetRlqsServer())
	}
	matchers := f.GetBucketMatchers().GetMatcherList().GetMatchers()
	if len(matchers) == 0 {
		t.Fatal("no bucket matcher")
	}
	for i, m := range matchers {
		settings := unpack[*rlqsfilterv3.RateLimitQuotaBucketSettings](t, m.GetOnMatch().GetAction().GetTypedConfig())
		var entries []config.Entry
		for key := range settings.GetBucketIdBuilder().GetBucketIdBuilder() {
			entries = append(entries, config.Entry{Key: key, Value: "some-key"})
		}
		if len(entries) != 1 {
			t.Fatalf("matcher %d: bucket keys %v: the test knows one-key buckets only", i, entries)
		}
		if n := dom.Match(entries); n == nil || len(n.Limits) == 0 {
			t.Errorf("matcher %d: bucket %v names no descriptor with limits in domain %s", i, entries, dom.Name)
		}
		if got := settings.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule(); got != typev3.RateLimitStrategy_DENY_ALL || settings.GetExpiredAssignmentBehavior().GetFallbackRateLimit() == nil {
			t.Errorf("matcher %d: expired_assignment_behavior %v, want fallback_rate_limit DENY_ALL", i, settings.GetExpiredAssignmentBehavior())
		}
		if d := settings.GetExpiredAssignmentBehavior().GetExpiredAssignmentBehaviorTimeout().AsDuration(); d < 30*time.Second {
			t.Errorf("matcher %d: expired_assignment_behavior_timeout %v, want 30 s or more (0, unset, abandons the bucket at once: ALLOW_ALL)", i, d)
		}
	}
}
