package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
	"github.com/rlsproject/rls/internal/tlsfiles"
	"github.com/rlsproject/rls/internal/xdsconfig/xdstest"
)

// launchCompat runs the program as a process started as /bin/ratelimit
// would (no arguments) with env, and stops it when the test ends.
func launchCompat(t *testing.T, env []string, grpcAddr, httpAddr string) *server {
	t.Helper()
	args := compatArgs("/bin/ratelimit", nil)
	if args[0] != "serve" {
		t.Fatalf("compatArgs(/bin/ratelimit) = %q, want serve ...", args)
	}
	cfg, err := parseServeFlags(args[1:], env, io.Discard)
	if err != nil {
		t.Fatalf("rls as /bin/ratelimit: %v", err)
	}
	// A store timeout of a second: these tests count exactly, and the
	// environment cannot set one.
	cfg.Store.Redis.Timeout = time.Second
	return serveConfig(t, cfg, env, grpcAddr, httpAddr)
}

// hostPort splits a loopback address for HOST/PORT style variables.
func hostPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return h, p
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// tlsClient dials addr over TLS trusting caFile, with a client certificate
// when cert is set.
func tlsClient(t *testing.T, addr, caFile, cert, key string) rlsv3.RateLimitServiceClient {
	t.Helper()
	cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: caFile, Cert: cert, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// egRoute is a route name as Envoy Gateway writes it into descriptors.
const egRoute = "httproute/default/backend/rule/0/match/0/www_example_com"

// egLimitConfig is a RateLimitConfig shaped as Envoy Gateway's translator
// writes them: the listener as domain and name, the route as key and
// value, under it rule 0's distinct-per-user node (key only) holding the
// limit, and rule 1's exact header match (key and value).
func egLimitConfig(rpu uint32, unit rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   "default/eg/http",
		Domain: "default/eg/http",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: egRoute, Value: egRoute,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "rule-0-match-0", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu}},
				{Key: "rule-1-match-0", Value: "gold", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 100}},
			},
		}},
	}
}

// answers sends n requests for user and returns their codes, "OK" or
// "OVER_LIMIT", space-separated.
func answers(t *testing.T, cl rlsv3.RateLimitServiceClient, user string, n int) string {
	t.Helper()
	var out []string
	for range n {
		resp, err := cl.ShouldRateLimit(context.Background(), rlRequest("default/eg/http", egRoute, egRoute, "rule-0-match-0", user))
		if err != nil {
			t.Fatalf("ShouldRateLimit(user %s): %v", user, err)
		}
		out = append(out, resp.GetOverallCode().String())
	}
	return strings.Join(out, " ")
}

// TestEnvoyGatewayDropIn starts rls as /bin/ratelimit with the environment
// Envoy Gateway gives its rate-limit deployment (addresses and paths made
// local; RUNTIME_ROOT does not exist): TLS on gRPC without client
// certificates (GRPC_CLIENT_TLS_CACERT is not set), mutual TLS to the xDS
// server, Redis over tcp, Prometheus on PROMETHEUS_ADDR. A go-control-plane
// server pushes an Envoy Gateway-shaped config, an update, then an invalid
// config, which is NACKed while the update stays in force.
func TestEnvoyGatewayDropIn(t *testing.T) {
	pki := testpki.New(t)
	rds := redistest.Start(t)
	xds := xdstest.Start(t, pki.ServerTLS(t)) // requires rls's client certificate
	xds.Push(t, "envoy-ratelimit", "1", egLimitConfig(3, rlsconfv3.RateLimitUnit_HOUR))

	grpcAddr, httpAddr, debugAddr, promAddr := servetest.Addr(t), servetest.Addr(t), servetest.Addr(t), servetest.Addr(t)
	host, port := hostPort(t, httpAddr)
	grpcHost, grpcPort := hostPort(t, grpcAddr)
	debugHost, debugPort := hostPort(t, debugAddr)
	env := []string{
		"RUNTIME_ROOT=" + filepath.Join(t.TempDir(), "data"), // not mounted by Envoy Gateway
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_IGNOREDOTFILES=true",
		"RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info",
		"USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL=" + xds.Addr,
		"CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"GRPC_SERVER_USE_TLS=true",
		"GRPC_SERVER_TLS_CERT=" + pki.Cert,
		"GRPC_SERVER_TLS_KEY=" + pki.Key,
		"GRPC_SERVER_TLS_CA_CERT=" + pki.CA,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT=" + pki.Cert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY=" + pki.Key,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + pki.CA,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + rds.Addr(),
		"USE_PROMETHEUS=true",
		"PROMETHEUS_ADDR=" + promAddr,
		"HOST=" + host, "PORT=" + port,
		"GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort,
		"DEBUG_HOST=" + debugHost, "DEBUG_PORT=" + debugPort,
		// Short retries: the server resends a refused version at once.
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL=50ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=200ms",
	}
	s := launchCompat(t, env, grpcAddr, httpAddr)
	s.waitUntil(t, "GET /healthcheck answers 200", func() bool {
		code, body := httpGet(t, "http://"+httpAddr+"/healthcheck")
		return code == 200 && body == "OK"
	})
	xds.WaitFor(t, 20*time.Second, "ACK of version 1", xdstest.ACKed("1"))

	cl := tlsClient(t, grpcAddr, pki.CA, "", "") // no client certificate: not required
	if got := answers(t, cl, "alice", 4); got != "OK OK OK OVER_LIMIT" {
		t.Errorf("version 1 (3/hour), alice × 4: %s", got)
	}

	xds.Push(t, "envoy-ratelimit", "2", egLimitConfig(5, rlsconfv3.RateLimitUnit_HOUR))
	xds.WaitFor(t, 20*time.Second, "ACK of version 2", xdstest.ACKed("2"))
	if got := answers(t, cl, "bob", 6); got != "OK OK OK OK OK OVER_LIMIT" {
		t.Errorf("version 2 (5/hour), bob × 6: %s", got)
	}
	// alice's counter is kept across the update: 4 taken of 5 (her denied
	// request counted too, as in the reference: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
	// is not set).
	if got := answers(t, cl, "alice", 3); got != "OK OVER_LIMIT OVER_LIMIT" {
		t.Errorf("version 2, alice × 3 more: %s", got)
	}

	xds.Push(t, "envoy-ratelimit", "3", egLimitConfig(1, rlsconfv3.RateLimitUnit_UNKNOWN))
	var nack *discoveryv3.DiscoveryRequest
	xds.WaitFor(t, 20*time.Second, "NACK of version 3", func(reqs []*discoveryv3.DiscoveryRequest, _ int) bool {
		if n := xdstest.NACKs(reqs); len(n) > 0 {
			nack = n[0]
		}
		return nack != nil
	})
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "unit is required") || nack.GetVersionInfo() != "2" {
		t.Errorf("NACK: version %q, error_detail %q; want version 2 and the validation error", nack.GetVersionInfo(), msg)
	}
	if got := answers(t, cl, "carol", 6); got != "OK OK OK OK OK OVER_LIMIT" {
		t.Errorf("after the refused version 3 (version 2 in force, 5/hour), carol × 6: %s", got)
	}

	if code, body := httpGet(t, "http://"+httpAddr+"/healthcheck"); code != 200 || body != "OK" {
		t.Errorf("GET /healthcheck = %d %q, want 200 OK", code, body)
	}
	code, metrics := httpGet(t, "http://"+promAddr+"/metrics")
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="default/eg/http",key1="` + egRoute + `_` + egRoute + `",key2="rule-0-match-0"} 19`,
		`ratelimit_service_rate_limit_over_limit{domain="default/eg/http",key1="` + egRoute + `_` + egRoute + `",key2="rule-0-match-0"} 5`,
		`ratelimit_service_config_load_success 3`, // the empty start (FORCE_START_WITHOUT_INITIAL_CONFIG), versions 1 and 2
		`ratelimit_service_config_load_error 1`,
		`rls_config_last_reload_successful 0`,
		`rls_requests_total{code="OVER_LIMIT"} 5`,
	} {
		if code != 200 || !strings.Contains(metrics, want+"\n") {
			t.Errorf("GET %s/metrics (%d) lacks %q", promAddr, code, want)
		}
	}
	if code, body := httpGet(t, "http://"+debugAddr+"/rlconfig"); code != 200 ||
		!strings.Contains(body, "default/eg/http."+egRoute+"_"+egRoute+".rule-0-match-0: unit=HOUR requests_per_unit=5, shadow_mode: false") {
		t.Errorf("GET /rlconfig = %d:\n%s", code, body)
	}
	counters, err := redistest.Counters(func(args ...string) (string, error) { return redistest.Command(rds.Addr(), args...) }, "rls:")
	if all := strings.Join(counters, " "); err != nil || len(counters) != 3 || strings.Count(all, "rule-0-match-0") != 3 || strings.Count(all, "}:fw3600s") != 3 {
		t.Errorf("counters under rls: = %q (%v), want the hourly counters of alice, bob and carol", counters, err)
	}
}

// Without FORCE_START_WITHOUT_INITIAL_CONFIG, rls is not healthy until
// the xDS server sends a first config.
func TestCompatXDSNotHealthyBeforeFirstConfig(t *testing.T) {
	rds := redistest.Start(t)
	xds := xdstest.Start(t, nil)
	grpcAddr, httpAddr := servetest.Addr(t), servetest.Addr(t)
	host, port := hostPort(t, httpAddr)
	grpcHost, grpcPort := hostPort(t, grpcAddr)
	env := []string{
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xds.Addr, "CONFIG_GRPC_XDS_NODE_ID=n",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(), "USE_STATSD=false",
		"HOST=" + host, "PORT=" + port, "GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
	}
	s := launchCompat(t, env, grpcAddr, httpAddr)
	s.waitUntil(t, "rls answers /healthz", func() bool { code, _ := httpGet(t, "http://"+httpAddr+"/healthz"); return code == 200 })
	// The client has asked for configs and received none.
	xds.WaitFor(t, 20*time.Second, "a request", func(reqs []*discoveryv3.DiscoveryRequest, _ int) bool { return len(reqs) > 0 })
	if code, body := httpGet(t, "http://"+httpAddr+"/healthcheck"); code != 500 {
		t.Errorf("GET /healthcheck before a config = %d %q, want 500", code, body)
	}
	xds.Push(t, "n", "1", egLimitConfig(3, rlsconfv3.RateLimitUnit_HOUR))
	s.waitUntil(t, "GET /healthcheck answers 200 after the first config", func() bool {
		code, _ := httpGet(t, "http://"+httpAddr+"/healthcheck")
		return code == 200
	})
}
