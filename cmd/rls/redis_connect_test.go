package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/testpki"
)

// refusedAnswerBound is how soon rls must answer a /json call with Redis
// refusing connections and --store-timeout 2s: a tenth of the timeout.
// Each call took 0.41 s when go-redis dialed five times, 100 ms apart,
// inside it; the README gives the figures measured since.
const refusedAnswerBound = 200 * time.Millisecond

// postJSON posts a one-descriptor request of domain shared, key k, value v
// to rls's /json and returns the status and how long the answer took.
func postJSON(t *testing.T, s *server, v string) (int, time.Duration) {
	t.Helper()
	body := fmt.Sprintf(`{"domain":"shared","descriptors":[{"entries":[{"key":"k","value":%q}]}]}`, v)
	start := time.Now()
	resp, err := http.Post("http://"+s.httpAddr+"/json", "application/json", strings.NewReader(body))
	d := time.Since(start)
	if err != nil {
		t.Fatalf("POST /json: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode, d
}

// readyz returns the status of rls's /readyz.
func readyz(t *testing.T, s *server) int {
	t.Helper()
	resp, err := http.Get("http://" + s.httpAddr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// healthIs waits until the gRPC health of rls's rate-limit service is want.
func healthIs(t *testing.T, s *server, want healthpb.HealthCheckResponse_ServingStatus, what string) {
	t.Helper()
	hc := healthpb.NewHealthClient(s.dial(t))
	s.waitUntil(t, "gRPC health "+want.String()+" "+what, func() bool {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		return err == nil && r.Status == want
	})
}

// checkRefusedFast: with the node of value v refusing connections, 20
// /json calls for v each answer 503 within refusedAnswerBound, /readyz
// says 503 and the gRPC health NOT_SERVING; once restart has brought the
// node back, rls serves again by itself: /readyz 200, SERVING, /json 200.
func checkRefusedFast(t *testing.T, s *server, v string, kill, restart func()) {
	t.Helper()
	s.waitUntil(t, "a request for "+v+" decided by Redis", func() bool { code, _ := postJSON(t, s, v); return code == 200 })
	healthIs(t, s, healthpb.HealthCheckResponse_SERVING, "before the fault")
	kill()
	var took []time.Duration
	for i := range 20 {
		code, d := postJSON(t, s, v)
		took = append(took, d)
		if code != 503 || d > refusedAnswerBound {
			t.Errorf("/json %d with Redis refusing connections: %d after %s; want 503 well before the 2 s store timeout (within %s)", i, code, d, refusedAnswerBound)
		}
	}
	slices.Sort(took)
	t.Logf("20 /json calls with Redis refusing connections: median %s, max %s", took[len(took)/2], took[len(took)-1])
	if code := readyz(t, s); code != 503 {
		t.Errorf("/readyz with Redis refusing connections = %d, want 503", code)
	}
	healthIs(t, s, healthpb.HealthCheckResponse_NOT_SERVING, "with Redis refusing connections")
	restart()
	s.waitUntil(t, "/readyz 200 once Redis is back", func() bool { return readyz(t, s) == 200 })
	healthIs(t, s, healthpb.HealthCheckResponse_SERVING, "once Redis is back")
	if code, _ := postJSON(t, s, v); code != 200 {
		t.Errorf("/json once Redis is back = %d, want 200", code)
	}
}

// TestRedisRefusedAnswersFast: Redis killed (its port refuses
// connections) under --store-timeout 2s: every /json call answers 503 well
// before the timeout, readiness and the gRPC health follow, and Redis
// coming back is picked up without restarting rls; on a single node and,
// for the slots of a killed master, on a cluster.
func TestRedisRefusedAnswersFast(t *testing.T) {
	cfg := writeFile(t, t.TempDir(), "shared.yaml", sharedConfig)
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", srv.URL(), "--store-timeout", "2s")
		checkRefusedFast(t, s, "v", srv.Kill, srv.Restart)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-cluster", strings.Join(c.Seeds(), ","), "--store-timeout", "2s")
		// rls's key of value v has the hash tag {shared/k=v}.
		master := c.Master(c.KeySlot("{shared/k=v}"))
		checkRefusedFast(t, s, "v", master.Kill, func() {
			master.Restart() // it rejoins with its slots
			c.WaitHealthy()
		})
	})
}

// TestRedisTLSFirstCallAfterReady: rls started against Redis over TLS,
// with the default store timeout (10 ms), decides the first /json call
// after /readyz says 200, at each of 4 cold starts. The pipelines dialed
// and made their TLS handshakes inside the first calls' deadlines: 4 of 12
// cold starts failed, once after /readyz said 200.
func TestRedisTLSFirstCallAfterReady(t *testing.T) {
	pki := testpki.New(t)
	srv := redistest.StartWith(t, redistest.Config{TLS: pki})
	cfg := writeFile(t, t.TempDir(), "shared.yaml", sharedConfig)
	for i := range 4 {
		s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", "rediss://"+srv.Addr()+"/0", "--redis-ca", pki.CA)
		s.waitUntil(t, "/readyz 200", func() bool { return readyz(t, s) == 200 })
		if code, _ := postJSON(t, s, fmt.Sprint("first-", i)); code != 200 {
			t.Errorf("cold start %d: the first /json call after /readyz said 200 = %d, want 200\n%s", i, code, s.logs)
		}
		s.stop(t)
	}
}
