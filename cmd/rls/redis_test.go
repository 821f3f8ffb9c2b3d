package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
)

const sharedConfig = "domain: shared\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: hour, requests_per_unit: 500}\n      - {unit: minute, requests_per_unit: 100000, algorithm: sliding_window}\n"

// TestTwoProcessesShareOneRedis: two rls servers on one Redis, 64 concurrent
// clients, admit exactly the limit between them, with no error. What it
// checks is the count, not the store timeout: at the default 10 ms this
// test passed 40 of 40 runs alone, but under the race detector, with go
// test running other packages' tests on the same two cores, requests
// missed even 100 ms (3 runs of 15 with two busy loops beside it), and an
// UNAVAILABLE fails the test. The timeout is 2 s, which only a broken
// store reaches.
func TestTwoProcessesShareOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeFile(t, t.TempDir(), "shared.yaml", sharedConfig)
	args := []string{"--config", cfg, "--store", "redis", "--redis-url", srv.URL(), "--store-timeout", "2s"}
	a := startServer(t, nil, args...)
	b := startServer(t, nil, args...)
	clients := []rlsv3.RateLimitServiceClient{rlsv3.NewRateLimitServiceClient(a.dial(t)), rlsv3.NewRateLimitServiceClient(b.dial(t))}
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			cl := clients[w%2]
			for range 12 {
				resp, err := cl.ShouldRateLimit(context.Background(), rlRequest("shared", "k", "v"))
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
				} else {
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 500 || denied.Load() != 64*12-500 {
		t.Errorf("two processes, 64 clients, 768 requests: %d admitted, %d denied; want exactly 500 admitted", admitted.Load(), denied.Load())
	}
}

// TestRedisOutage: Redis killed mid-traffic, then restarted on the same
// port. While it is down, requests get UNAVAILABLE within the store timeout
// (--on-store-error=error) and /readyz says 503; after the restart every
// request succeeds again, without restarting rls.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeFile(t, t.TempDir(), "shared.yaml", sharedConfig)
	s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", srv.URL(), "--store-timeout", "50ms")
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	n := 0
	ask := func() error {
		n++
		_, err := askBounded(rl, rlRequest("shared", "k", fmt.Sprint(n)))
		return err
	}
	ready := func() int {
		resp, err := http.Get("http://" + s.httpAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// 20 requests decided before the outage, each asked again if it missed
	// the 50 ms store timeout: under the race detector on a busy machine a
	// sound round trip can (1 run of 15 with two busy loops beside it).
	for i := range 20 {
		s.waitUntil(t, fmt.Sprintf("request %d before the outage decided", i), func() bool { return ask() == nil })
	}
	if got := ready(); got != 200 {
		t.Fatalf("/readyz before the outage = %d", got)
	}

	srv.Kill()
	for i := range 20 {
		if err := ask(); status.Code(err) != codes.Unavailable {
			t.Errorf("request %d with Redis down: %v, want UNAVAILABLE (by the 50ms store timeout)", i, err)
		}
	}
	if got := ready(); got != 503 {
		t.Errorf("/readyz with Redis down = %d, want 503", got)
	}
	hc := healthpb.NewHealthClient(s.dial(t))
	for _, name := range []string{"envoy.service.ratelimit.v3.RateLimitService", "ratelimit"} { // rls's name, the reference's
		s.waitUntil(t, "gRPC health of "+name+" NOT_SERVING with Redis down", func() bool {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
			return err == nil && r.Status == healthpb.HealthCheckResponse_NOT_SERVING
		})
	}

	srv.Restart()
	failed := 0
	for i := range 50 {
		if err := ask(); err != nil {
			failed++
			t.Logf("request %d after the restart: %v", i, err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of 50 requests failed after Redis came back; want 0", failed)
	}
	if got := ready(); got != 200 {
		t.Errorf("/readyz after the restart = %d, want 200", got)
	}
}

// TestNoSecretsInLogs: the Redis password in --redis-url never reaches the
// log, even while Redis is unreachable.
func TestNoSecretsInLogs(t *testing.T) {
	cfg := writeFile(t, t.TempDir(), "shared.yaml", sharedConfig)
	s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", "redis://admin:hunter2@"+servetest.Addr(t)+"/0", "--log-level", "debug")
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	for range 5 {
		if _, err := rl.ShouldRateLimit(context.Background(), rlRequest("shared", "k", "v")); status.Code(err) != codes.Unavailable {
			t.Errorf("with Redis unreachable: %v, want UNAVAILABLE", err)
		}
	}
	if resp, err := http.Get("http://" + s.httpAddr + "/readyz"); err == nil {
		resp.Body.Close()
	}
	s.stop(t)
	if logs := s.logs.String(); strings.Contains(logs, "hunter2") {
		t.Errorf("the Redis password appears in the log:\n%s", logs)
	} else if !strings.Contains(logs, "Redis does not answer") {
		t.Errorf("the log does not say Redis is unreachable:\n%s", logs)
	}
}
