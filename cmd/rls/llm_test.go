package main

import (
	"os"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
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
	t.Run("compat", testLLMCompat)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			cfg := writeFile(t, t.TempDir(), "llm.yaml", llmConfig)
			args := []string{"--config", cfg, "--store", store}
			if store == "redis" {
				// A second to decide: these counts are exact, and a loaded
				// machine misses the 10 ms default.
				args = append(args, "--redis-url", redistest.Start(t).URL(), "--store-timeout", "1s")
			}
			s := startServer(t, nil, args...)
			rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
			for _, tc := range []struct {
				tenant    string
				exhausted bool
			}{{"counted", true}, {"native", false}} {
				checkBudget(t, rl, tc.tenant, tc.exhausted)
			}
		})
	}
}

// checkBudget runs the check-and-charge pattern on tenant's budget of 1000
// and checks whether the charges exhausted it.
func checkBudget(t *testing.T, rl rlsv3.RateLimitServiceClient, tenant string, exhausted bool) {
	t.Helper()
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
	if r := ask(tenant, 900); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%s: the first 900 tokens: %v", tenant, r.OverallCode)
	}
	checks := 0
	for round := range 3 {
		if ask(tenant, 1).OverallCode == rlsv3.RateLimitResponse_OK {
			checks++
		}
		if r := ask(tenant, 5000); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s round %d: a charge of 5000 over a budget of 1000 = %v, want OVER_LIMIT", tenant, round, r.OverallCode)
		}
	}
	look := ask(tenant, 0).Statuses[0]
	if exhausted && (checks != 1 || look.LimitRemaining != 0) {
		t.Errorf("%s: %d of 3 checks admitted, %d remaining; want 1 (before the first charge) and 0: the charges count", tenant, checks, look.LimitRemaining)
	}
	if !exhausted && (checks != 3 || look.LimitRemaining != 97) {
		t.Errorf("%s: %d of 3 checks admitted, %d remaining; want 3 and 97 (denied charges count nothing)", tenant, checks, look.LimitRemaining)
	}
}

// testLLMCompat: started as envoyproxy/ratelimit, rls counts denied hits
// as the reference does (the budget runs out with a config that does not
// ask for it), unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true.
func testLLMCompat(t *testing.T) {
	for _, tc := range []struct {
		stop      string
		exhausted bool
	}{{"false", true}, {"true", false}} {
		root := t.TempDir()
		dir := filepath.Join(root, "rl", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, "llm.yaml", llmConfig)
		grpcAddr, httpAddr := servetest.Addr(t), servetest.Addr(t)
		host, port := hostPort(t, httpAddr)
		grpcHost, grpcPort := hostPort(t, grpcAddr)
		env := []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=rl", "BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp",
			"REDIS_URL=" + redistest.Start(t).Addr(), "USE_STATSD=false", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=" + tc.stop,
			"HOST=" + host, "PORT=" + port, "GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0"}
		s := launchCompat(t, env, grpcAddr, httpAddr)
		s.waitUntil(t, "GET /healthcheck answers 200", func() bool { code, _ := httpGet(t, "http://"+httpAddr+"/healthcheck"); return code == 200 })
		checkBudget(t, rlsv3.NewRateLimitServiceClient(s.dial(t)), "native", tc.exhausted)
	}
}
