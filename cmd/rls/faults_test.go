package main

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/redistest"
)

// answerBound bounds a call that the store timeout must answer: a call that
// hangs past it fails with DeadlineExceeded, which no test expects, instead
// of the answer of --on-store-error. It is far above the store timeouts the
// tests set, so that a slow machine does not fail them; no test measures a
// duration.
const answerBound = 5 * time.Second

// askBounded calls rl within answerBound.
func askBounded(rl rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), answerBound)
	defer cancel()
	return rl.ShouldRateLimit(ctx, req)
}

// policyAnswers are what a request gets under each --on-store-error policy
// when the store cannot answer.
var policyAnswers = []struct {
	policy string
	code   codes.Code
	want   rlsv3.RateLimitResponse_Code
}{
	{"error", codes.Unavailable, 0},
	{"allow", codes.OK, rlsv3.RateLimitResponse_OK},
	{"deny", codes.OK, rlsv3.RateLimitResponse_OVER_LIMIT},
}

// decidedByRedis reports whether a request was answered by Redis's
// decision: without an error, and with every status naming its limit (under
// --on-store-error=allow or deny, a store that failed or timed out is
// answered without an error, and without current limits).
func decidedByRedis(resp *rlsv3.RateLimitResponse, err error) bool {
	if err != nil || len(resp.GetStatuses()) == 0 {
		return false
	}
	for _, st := range resp.Statuses {
		if st.CurrentLimit == nil {
			return false
		}
	}
	return true
}

// TestRedisPausedPolicies: a Redis that hangs (SIGSTOP) gets every request
// answered by the store timeout, as --on-store-error says.
func TestRedisPausedPolicies(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeFile(t, t.TempDir(), "shared.yaml", sharedConfig)
	servers := map[string]*server{}
	for _, policy := range []string{"error", "allow", "deny"} {
		servers[policy] = startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", srv.URL(), "--store-timeout", "30ms", "--on-store-error", policy)
	}
	// Warm the connections while Redis answers: asked again until Redis
	// decided (on a machine busy with other tests a sound round trip can
	// miss 30 ms, and the policy answers, with UNAVAILABLE under error).
	for policy, s := range servers {
		rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
		s.waitUntil(t, policy+": a request decided by Redis before the pause", func() bool {
			return decidedByRedis(askBounded(rl, rlRequest("shared", "k", "warm")))
		})
	}
	srv.Pause()
	defer srv.Resume()
	for _, tc := range policyAnswers {
		rl := rlsv3.NewRateLimitServiceClient(servers[tc.policy].dial(t))
		for i := range 5 {
			resp, err := askBounded(rl, rlRequest("shared", "k", fmt.Sprint(i)))
			if status.Code(err) != tc.code || (err == nil && resp.OverallCode != tc.want) {
				t.Errorf("--on-store-error=%s, Redis paused, request %d: %v %v; want %s %s (by the 30ms store timeout)", tc.policy, i, resp.GetOverallCode(), err, tc.code, tc.want)
			}
		}
	}
	srv.Resume()
	for policy, s := range servers {
		rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
		s.waitUntil(t, policy+": requests decided by Redis once it resumed", func() bool {
			return decidedByRedis(askBounded(rl, rlRequest("shared", "k", "after")))
		})
	}
}

// TestClusterFailover: a master of a 3-master cluster with replicas is
// killed; while the replica takes over, requests get the policy's answer
// within the timeout, and afterwards they all succeed again, without an rls
// restart.
func TestClusterFailover(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	cfg := writeFile(t, t.TempDir(), "shared.yaml", sharedConfig)
	seeds := ""
	for i, s := range c.Seeds() {
		if i > 0 {
			seeds += ","
		}
		seeds += s
	}
	s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-cluster", seeds, "--store-timeout", "200ms")
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	ask := func(v string) error {
		_, err := askBounded(rl, rlRequest("shared", "k", v))
		return err
	}
	// Values on every master, each decided once before the failover (asked
	// again if a busy machine made it miss the 200 ms store timeout).
	var values []string
	for i := range 64 {
		values = append(values, fmt.Sprint("v", i))
	}
	for _, v := range values {
		s.waitUntil(t, "before failover: "+v+" decided", func() bool { return ask(v) == nil })
	}
	victim := c.Master(0)
	victim.Kill()
	start := time.Now()
	recovered := time.Time{}
	for time.Since(start) < 20*time.Second {
		failed := 0
		for _, v := range values {
			if err := ask(v); err != nil {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("during failover: %v, want UNAVAILABLE (--on-store-error=error, by the 200ms store timeout)", err)
				}
				failed++
			}
		}
		if failed == 0 {
			recovered = time.Now()
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if recovered.IsZero() {
		t.Fatalf("requests still fail 20s after the master was killed\n%s", s.logs)
	}
	t.Logf("all requests succeed again %s after the master was killed", recovered.Sub(start).Round(time.Millisecond))
}

// algorithmsConfig has one descriptor per algorithm, each a limit of 100.
const algorithmsConfig = `domain: faults
descriptors:
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: sl
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_log}
  - key: tb
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
`

// everyAlgorithmRequest asks one hit (0: a look) of each algorithm's limit.
func everyAlgorithmRequest(hits uint32) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "faults", HitsAddend: hits}
	for _, k := range []string{"fw", "sw", "sl", "tb"} {
		req.Descriptors = append(req.Descriptors, rlRequest("faults", k, "client").Descriptors[0])
	}
	if hits == 0 {
		for _, d := range req.Descriptors {
			d.HitsAddend = &wrapperspb.UInt64Value{Value: 0}
		}
	}
	return req
}

// TestSlowNetworkPolicies: with 15 ms added each way between rls and Redis
// and a 10 ms store timeout, 120 sequential requests under each
// --on-store-error policy are answered as the policy says, and, once the
// network heals, a look shows every algorithm's whole limit: nothing that
// rls answered without Redis's decision was consumed.
func TestSlowNetworkPolicies(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeFile(t, t.TempDir(), "faults.yaml", algorithmsConfig)
	for _, tc := range policyAnswers {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			proxy := redistest.StartFaultProxy(t, srv.Addr())
			s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", "redis://"+proxy.Addr()+"/0",
				"--redis-prefix", tc.policy+":", "--store-timeout", "10ms", "--on-store-error", tc.policy)
			rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
			// A look while the network is sound: asked again until Redis
			// decided it (on a machine busy with other tests, even a sound
			// round trip can miss a 10 ms deadline, and the policy answers:
			// allow with no current limit, deny with OVER_LIMIT).
			look := func(what string) {
				t.Helper()
				var resp *rlsv3.RateLimitResponse
				s.waitUntil(t, what+": a look decided by Redis", func() bool {
					var err error
					resp, err = askBounded(rl, everyAlgorithmRequest(0))
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						return false
					}
					for _, st := range resp.Statuses {
						if st.CurrentLimit == nil {
							return false
						}
					}
					return true
				})
				for i, st := range resp.Statuses {
					if st.LimitRemaining != 100 {
						t.Errorf("%s: descriptor %d remaining %d, want 100", what, i, st.LimitRemaining)
					}
				}
			}
			look("before the fault")
			// Outcomes of the 120 requests only (a look that missed its
			// deadline above has its own).
			outcomes := func() (expired, indeterminate int) {
				expired, _ = strconv.Atoi(metricValue(t, s.httpAddr, "rls_redis_expired_total"))
				indeterminate, _ = strconv.Atoi(metricValue(t, s.httpAddr, "rls_redis_indeterminate_total"))
				return expired, indeterminate
			}
			expired0, indeterminate0 := outcomes()
			proxy.SetLatency(15 * time.Millisecond)
			for i := range 120 {
				resp, err := askBounded(rl, everyAlgorithmRequest(1))
				if status.Code(err) != tc.code || (err == nil && resp.OverallCode != tc.want) {
					t.Fatalf("request %d: %v %v; want %s %s", i, resp.GetOverallCode(), err, tc.code, tc.want)
				}
			}
			proxy.Heal()
			// Redis said of each request that it came past its deadline. On
			// a machine slowed by the race detector a reply may come after
			// the pipeline's bound: rls then cannot tell (indeterminate),
			// although the look below shows nothing was consumed.
			var expired, indeterminate int
			s.waitUntil(t, "the 120 replies read", func() bool {
				e, i := outcomes()
				expired, indeterminate = e-expired0, i-indeterminate0
				return expired+indeterminate >= 120
			})
			if expired+indeterminate != 120 || (!raceEnabled && indeterminate != 0) {
				t.Errorf("expired %v, indeterminate %v; want 120 expired", expired, indeterminate)
			}
			look("after the fault healed")
		})
	}
}

// TestCallerDeadlineBeforeStoreTimeout: a caller that gives rls 80 ms, with
// Redis 200 ms away and a store timeout of a second, gets rls's own answer
// (UNAVAILABLE under --on-store-error=error) before its deadline, not
// DEADLINE_EXCEEDED: rls answers a margin before the caller's deadline.
//
// The margin is 5 ms, and under the race detector on a busy machine the
// answer can take longer than that to reach the caller (5 runs of 15 with
// two busy loops beside it had a DEADLINE_EXCEEDED). So the test asks until
// three requests got rls's answer, up to 30: an rls that waited for its
// store timeout never gets there, and one that answered at the caller's
// deadline would lose nearly every race.
// Any answer other than UNAVAILABLE or a missed deadline fails.
func TestCallerDeadlineBeforeStoreTimeout(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	cfg := writeFile(t, t.TempDir(), "faults.yaml", algorithmsConfig)
	s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", "redis://"+proxy.Addr()+"/0", "--store-timeout", "1s")
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	if _, err := askBounded(rl, everyAlgorithmRequest(0)); err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(100 * time.Millisecond)
	answered, missed := 0, 0
	for i := 0; i < 30 && answered < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 80*time.Millisecond)
		_, err := rl.ShouldRateLimit(ctx, everyAlgorithmRequest(1))
		cancel()
		switch status.Code(err) {
		case codes.Unavailable:
			answered++
		case codes.DeadlineExceeded:
			missed++
		default:
			t.Fatalf("request %d with an 80 ms deadline, Redis 200 ms away: %v, want UNAVAILABLE from rls", i, err)
		}
	}
	if answered < 3 {
		t.Errorf("requests with an 80 ms deadline, Redis 200 ms away: %d got UNAVAILABLE from rls, %d DEADLINE_EXCEEDED; want rls's answer before the deadline", answered, missed)
	} else if missed > 0 {
		t.Logf("%d requests missed their deadline before three got rls's answer (a busy machine)", missed)
	}
}
