package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/redistest"
)

// TestRedisPausedPolicies: a Redis that hangs (SIGSTOP) gets every request
// answered within the store timeout, as --on-store-error says.
func TestRedisPausedPolicies(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeFile(t, t.TempDir(), "shared.yaml", sharedConfig)
	servers := map[string]*server{}
	for _, policy := range []string{"error", "allow", "deny"} {
		servers[policy] = startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", srv.URL(), "--store-timeout", "30ms", "--on-store-error", policy)
	}
	// Warm the connections while Redis answers.
	for policy, s := range servers {
		rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
		if _, err := rl.ShouldRateLimit(context.Background(), rlRequest("shared", "k", "warm")); err != nil {
			t.Fatalf("%s: %v", policy, err)
		}
	}
	srv.Pause()
	defer srv.Resume()
	for _, tc := range []struct {
		policy string
		code   codes.Code
		want   rlsv3.RateLimitResponse_Code
	}{
		{"error", codes.Unavailable, 0},
		{"allow", codes.OK, rlsv3.RateLimitResponse_OK},
		{"deny", codes.OK, rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		rl := rlsv3.NewRateLimitServiceClient(servers[tc.policy].dial(t))
		for i := range 5 {
			start := time.Now()
			resp, err := rl.ShouldRateLimit(context.Background(), rlRequest("shared", "k", fmt.Sprint(i)))
			took := time.Since(start)
			if status.Code(err) != tc.code || (err == nil && resp.OverallCode != tc.want) {
				t.Errorf("--on-store-error=%s, Redis paused, request %d: %v %v; want %s %s", tc.policy, i, resp.GetOverallCode(), err, tc.code, tc.want)
			}
			if took > 500*time.Millisecond {
				t.Errorf("--on-store-error=%s, Redis paused, request %d took %s; want about the 30ms store timeout", tc.policy, i, took)
			}
		}
	}
	srv.Resume()
	for policy, s := range servers {
		rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := rl.ShouldRateLimit(context.Background(), rlRequest("shared", "k", "after"))
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: Redis resumed but requests still fail: %v", policy, err)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
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
	ask := func(v string) (time.Duration, error) {
		start := time.Now()
		_, err := rl.ShouldRateLimit(context.Background(), rlRequest("shared", "k", v))
		return time.Since(start), err
	}
	// Values on every master.
	var values []string
	for i := range 64 {
		values = append(values, fmt.Sprint("v", i))
	}
	for _, v := range values {
		if _, err := ask(v); err != nil {
			t.Fatalf("before failover: %v", err)
		}
	}
	victim := c.Master(0)
	victim.Kill()
	start := time.Now()
	recovered := time.Time{}
	for time.Since(start) < 20*time.Second {
		failed := 0
		for _, v := range values {
			took, err := ask(v)
			if took > 2*time.Second {
				t.Fatalf("a request took %s during failover; want about the 200ms store timeout", took)
			}
			if err != nil {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("during failover: %v, want UNAVAILABLE (--on-store-error=error)", err)
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
