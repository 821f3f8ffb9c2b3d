package main

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/redistest"
)

// llmConfig is an LLM token budget of 1000 per hour per tenant: with
// count_denied_hits, and without (rls's native rule).
const llmConfig = `domain: llm
descriptors:
  - key: tenant
    value: counted
    count_denied_hits: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: tenant
    value: native
    rate_limit: {unit: hour, requests_per_unit: 1000}
`

// TestLLMTokenBudget: the pattern of Envoy Gateway's response-cost rules and
// Envoy AI Gateway's quota policies: a check of one hit when the request
// comes, a charge of the tokens used when its stream ends (the same
// descriptor, hits_addend = tokens). With count_denied_hits a charge larger
// than what remains still counts, and the budget runs out: the next check
// is denied. Without it (rls's rule: a denied request consumes nothing), the
// charge is denied and counts nothing: the checks go on being admitted.
// Both stores.
func TestLLMTokenBudget(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			cfg := writeFile(t, t.TempDir(), "llm.yaml", llmConfig)
			args := []string{"--config", cfg, "--store", store}
			if store == "redis" {
				args = append(args, "--redis-url", redistest.Start(t).URL())
			}
			s := startServer(t, nil, args...)
			rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
			ask := func(tenant string, hits uint64) *rlsv3.RateLimitResponse {
				t.Helper()
				req := rlRequest("llm", "tenant", tenant)
				req.Descriptors[0].HitsAddend = wrapperspb.UInt64(hits)
				resp, err := askBounded(rl, req)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			for _, tc := range []struct {
				tenant    string
				exhausted bool
			}{{"counted", true}, {"native", false}} {
				if r := ask(tc.tenant, 900); r.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Fatalf("%s: the first 900 tokens: %v", tc.tenant, r.OverallCode)
				}
				checks := 0
				for round := range 3 {
					if ask(tc.tenant, 1).OverallCode == rlsv3.RateLimitResponse_OK {
						checks++
					}
					if r := ask(tc.tenant, 5000); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
						t.Errorf("%s round %d: a charge of 5000 over a budget of 1000 = %v, want OVER_LIMIT", tc.tenant, round, r.OverallCode)
					}
				}
				look := ask(tc.tenant, 0).Statuses[0]
				if tc.exhausted && (checks != 1 || look.LimitRemaining != 0) {
					t.Errorf("%s: %d of 3 checks admitted, %d remaining; want 1 (before the first charge) and 0: the charges count", tc.tenant, checks, look.LimitRemaining)
				}
				if !tc.exhausted && (checks != 3 || look.LimitRemaining != 97) {
					t.Errorf("%s: %d of 3 checks admitted, %d remaining; want 3 and 97 (denied charges count nothing)", tc.tenant, checks, look.LimitRemaining)
				}
			}
		})
	}
}
