package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
)

// The program's name decides the mode: ratelimit (any directory) is
// compatibility mode; any other name runs as asked.
func TestCompatArgs(t *testing.T) {
	for _, tc := range []struct {
		argv0 string
		args  []string
		want  string
	}{
		{"/bin/ratelimit", nil, "serve --compat envoy-ratelimit"},
		{"ratelimit", nil, "serve --compat envoy-ratelimit"},
		{"/usr/local/bin/rls", []string{"validate", "x.yaml"}, "validate x.yaml"},
		{"/bin/ratelimit-old", nil, ""},
	} {
		if got := strings.Join(compatArgs(tc.argv0, tc.args), " "); got != tc.want {
			t.Errorf("compatArgs(%q, %q) = %q, want %q", tc.argv0, tc.args, got, tc.want)
		}
	}
}

// A variable that envoyproxy/ratelimit's environment gives and rls cannot
// take (refused, a bad value, a failed check: internal/compat's
// TestCompatRefusedVariables lists them) stops rls started as
// /bin/ratelimit with exit code 2, the message naming the variable.
func TestCompatRefusedExitCode(t *testing.T) {
	for _, tc := range []struct{ env, want string }{
		{"GRPC_UDS=/tmp/s", `GRPC_UDS="/tmp/s": rls serves gRPC on TCP only`},
		{"LOG_LEVEL=loud", `LOG_LEVEL="loud": not one of`},
		{"GRPC_SERVER_USE_TLS=true", `GRPC_SERVER_USE_TLS="true": needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY`},
		// Two stats sinks: the reference does not start either.
		{"USE_PROMETHEUS=true USE_STATSD=true", `USE_PROMETHEUS="true": only one stats sink may be on, and USE_STATSD is true too`},
	} {
		err := run(context.Background(), compatArgs("/bin/ratelimit", nil), strings.Fields(tc.env), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || exitCode(err) != 2 {
			t.Errorf("rls as /bin/ratelimit with %s: %v (exit %d), want exit 2 and %q", tc.env, err, exitCode(err), tc.want)
		}
	}
}

// CONFIG_TYPE=FILE with the reference's runtime layout: every file under
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, a domain merged from two files
// with MERGE_DOMAIN_CONFIG; client certificates required with
// GRPC_CLIENT_TLS_CACERT, and of the name GRPC_CLIENT_TLS_SAN.
func TestCompatFileConfigAndClientCertificates(t *testing.T) {
	pki := testpki.New(t)
	rds := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "internal", "compat", "testdata", "envoy-ratelimit", "merge", f))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, f, string(b))
	}
	grpcAddr, httpAddr := servetest.Addr(t), servetest.Addr(t)
	host, port := hostPort(t, httpAddr)
	grpcHost, grpcPort := hostPort(t, grpcAddr)
	env := []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=rl", "MERGE_DOMAIN_CONFIG=true",
		"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + pki.Cert, "GRPC_SERVER_TLS_KEY=" + pki.Key,
		"GRPC_CLIENT_TLS_CACERT=" + pki.CA, "GRPC_CLIENT_TLS_SAN=envoy-gateway",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(), "USE_STATSD=false",
		"HOST=" + host, "PORT=" + port, "GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0"}
	s := launchCompat(t, env, grpcAddr, httpAddr)
	s.waitUntil(t, "GET /healthcheck answers 200", func() bool { code, _ := httpGet(t, "http://"+httpAddr+"/healthcheck"); return code == 200 })

	withCert := tlsClient(t, grpcAddr, pki.CA, pki.Cert, pki.Key)
	for _, tc := range []struct {
		kv   []string
		want string
	}{{[]string{"key1", "value1"}, "10"}, {[]string{"key2", "value2"}, "20"}} {
		resp, err := withCert.ShouldRateLimit(context.Background(), rlRequest("test-domain", tc.kv...))
		if err != nil {
			t.Fatalf("ShouldRateLimit(%v) with a client certificate: %v", tc.kv, err)
		}
		if got := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); strconv.FormatUint(uint64(got), 10) != tc.want {
			t.Errorf("merged domain %v: limit %d, want %s", tc.kv, got, tc.want)
		}
	}
	without := tlsClient(t, grpcAddr, pki.CA, "", "")
	if _, err := without.ShouldRateLimit(context.Background(), rlRequest("test-domain", "key1", "value1")); err == nil {
		t.Errorf("ShouldRateLimit without a client certificate under GRPC_CLIENT_TLS_CACERT: no error")
	}
}

// compatServe starts rls as /bin/ratelimit with env and a config file of
// the reference's format under RUNTIME_ROOT, and waits until it is healthy.
// Its StatsD sink is off unless env says USE_STATSD=true.
func compatServe(t *testing.T, env []string, config string) *server {
	t.Helper()
	return compatServeWithStats(t, append([]string{"USE_STATSD=false"}, env...), config)
}

// compatServeWithStats is compatServe with the reference's default sink
// (USE_STATSD, to localhost:8125) unless env says otherwise.
func compatServeWithStats(t *testing.T, env []string, config string) *server {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "limits.yaml", config)
	grpcAddr, httpAddr := servetest.Addr(t), servetest.Addr(t)
	host, port := hostPort(t, httpAddr)
	grpcHost, grpcPort := hostPort(t, grpcAddr)
	env = append(env, "RUNTIME_ROOT="+root, "HOST="+host, "PORT="+port,
		"GRPC_HOST="+grpcHost, "GRPC_PORT="+grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0")
	s := launchCompat(t, env, grpcAddr, httpAddr)
	s.waitUntil(t, "GET /healthcheck answers 200", func() bool { code, _ := httpGet(t, "http://"+httpAddr+"/healthcheck"); return code == 200 })
	return s
}

// redisCounters returns the counters of a Redis (through Do: AUTH when it
// has a password) under rls:, sorted.
func redisCounters(t *testing.T, srv *redistest.Server) []string {
	t.Helper()
	counters, err := redistest.Counters(srv.Do, "rls:")
	if err != nil {
		t.Fatal(err)
	}
	return counters
}

// TestCompatSentinelWithPerSecondRedis: rls as /bin/ratelimit with the
// reference's REDIS_TYPE=sentinel (a master, a replica, three sentinels,
// passwords on the master and on the sentinels) and REDIS_PERSECOND=true (a
// second redis-server): per-second counters live on the second Redis, the
// others on the master Sentinel names, and with
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true (rls's rule: a denied request
// consumes nothing) a request denied by its per-second limit consumes
// nothing of its hourly one.
func TestCompatSentinelWithPerSecondRedis(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{Password: "password123", SentinelPassword: "watchers"})
	perSecond := redistest.StartWith(t, redistest.Config{Password: "password456"})
	s := compatServe(t, []string{
		"REDIS_TYPE=sentinel", "REDIS_URL=" + st.Spec(), "REDIS_AUTH=password123", "REDIS_SENTINEL_AUTH=watchers",
		"REDIS_PERSECOND=true", "REDIS_PERSECOND_SOCKET_TYPE=tcp", "REDIS_PERSECOND_URL=" + perSecond.Addr(), "REDIS_PERSECOND_AUTH=password456",
		"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true",
	}, "domain: ps\ndescriptors:\n"+
		"  - key: closed\n    rate_limit: {unit: second, requests_per_unit: 0}\n"+
		"  - key: hourly\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"+
		"  - key: fast\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	ask := func(step string, want rlsv3.RateLimitResponse_Code, wantRemaining uint32, kv ...string) {
		t.Helper()
		req := rlRequest("ps", kv[:2]...)
		for i := 2; i < len(kv); i += 2 {
			req.Descriptors = append(req.Descriptors, rlRequest("ps", kv[i:i+2]...).Descriptors...)
		}
		resp, err := rl.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if resp.GetOverallCode() != want || resp.GetStatuses()[0].GetLimitRemaining() != wantRemaining {
			t.Fatalf("%s: %v, first status %v; want %v with %d remaining", step, resp.GetOverallCode(), resp.GetStatuses()[0], want, wantRemaining)
		}
	}
	ask("an hourly hit", rlsv3.RateLimitResponse_OK, 4, "hourly", "a")
	ask("an hourly hit with a per-second limit of 0", rlsv3.RateLimitResponse_OVER_LIMIT, 4, "hourly", "a", "closed", "a")
	ask("an hourly hit after the denied request", rlsv3.RateLimitResponse_OK, 3, "hourly", "a")
	if got, want := redisCounters(t, st.Master()), []string{"rls:{ps/hourly=a}:fw3600s"}; !slices.Equal(got, want) {
		t.Errorf("keys on the master: %q, want the hourly counter's", got)
	}
	// A per-second limit alone is decided by the per-second Redis only
	// (its keys expire with their second: their calls are counted).
	master, second := fcalls(t, st.Master()), fcalls(t, perSecond)
	ask("a per-second hit", rlsv3.RateLimitResponse_OK, 99, "fast", "a")
	if m, s := fcalls(t, st.Master())-master, fcalls(t, perSecond)-second; m != 0 || s != 1 {
		t.Errorf("a per-second request: %d FCALLs on the master, %d on the per-second Redis; want 0 and 1", m, s)
	}
}

// fcalls returns how many FCALLs srv has run.
func fcalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	out, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Fields(out) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_fcall:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

// TestCompatTLSSkipHostnameVerification: REDIS_TLS_SKIP_HOSTNAME_VERIFICATION
// =true reaches a TLS Redis whose certificate names another host, its CA
// trusted (REDIS_TLS_CACERT), and says so in the log; without it rls does
// not reach it.
func TestCompatTLSSkipHostnameVerification(t *testing.T) {
	pki := testpki.New(t)
	certPEM, keyPEM, _ := pki.IssueFor(t, "redis", false, "redis.elsewhere.example")
	dir := t.TempDir()
	elsewhere := &testpki.PKI{CA: pki.CA, Cert: filepath.Join(dir, "redis.crt"), Key: filepath.Join(dir, "redis.key")}
	writeFile(t, dir, "redis.crt", string(certPEM))
	writeFile(t, dir, "redis.key", string(keyPEM))
	srv := redistest.StartWith(t, redistest.Config{TLS: elsewhere})
	config := "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
	env := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + srv.Addr(), "REDIS_TLS=true", "REDIS_TLS_CACERT=" + pki.CA}

	s := compatServe(t, append(env, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true"), config)
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	if resp, err := rl.ShouldRateLimit(context.Background(), rlRequest("tls", "k", "v")); err != nil || resp.GetStatuses()[0].GetLimitRemaining() != 4 {
		t.Fatalf("through TLS without the host name check: %v %v", resp, err)
	}
	if !strings.Contains(s.logs.String(), "not that it names the host") {
		t.Errorf("no warning about the host name in the log:\n%s", s.logs)
	}

	checked := compatServe(t, env, config)
	rl = rlsv3.NewRateLimitServiceClient(checked.dial(t))
	if _, err := rl.ShouldRateLimit(context.Background(), rlRequest("tls", "k", "v")); status.Code(err) != codes.Unavailable {
		t.Errorf("with the host name checked: %v, want UNAVAILABLE (Redis's certificate names another host)", err)
	}
}
