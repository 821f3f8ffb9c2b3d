package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
)

// The debug and Prometheus listeners of compatibility mode bound their
// connections as the HTTP listener does (they had a header timeout only):
// at daemon.MaxExtraConnections, a new connection closes the one idle longest.
func TestCompatExtraListenersBoundConnections(t *testing.T) {
	rds := redistest.Start(t)
	grpcAddr, httpAddr, debugAddr, promAddr := servetest.Addr(t), servetest.Addr(t), servetest.Addr(t), servetest.Addr(t)
	host, port := hostPort(t, httpAddr)
	grpcHost, grpcPort := hostPort(t, grpcAddr)
	debugHost, debugPort := hostPort(t, debugAddr)
	env := []string{
		"RUNTIME_ROOT=" + t.TempDir(), "USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(),
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + promAddr,
		"HOST=" + host, "PORT=" + port, "GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort,
		"DEBUG_HOST=" + debugHost, "DEBUG_PORT=" + debugPort,
	}
	s := launchCompat(t, env, grpcAddr, httpAddr)
	s.waitUntil(t, "GET /healthcheck answers 200", func() bool {
		code, _ := httpGet(t, "http://"+httpAddr+"/healthcheck")
		return code == 200
	})
	for _, l := range []struct{ name, addr, path string }{{"DEBUG_PORT", debugAddr, "/rlconfig"}, {"PROMETHEUS_ADDR", promAddr, "/metrics"}} {
		dial := func() net.Conn {
			c, err := net.Dial("tcp", l.addr)
			if err != nil {
				t.Fatalf("%s: %v", l.name, err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		idle := dial()
		servetest.GetKeepAlive(t, idle, l.path)
		for range daemon.MaxExtraConnections {
			dial()
		}
		if !servetest.ClosedByServer(t, idle) {
			t.Errorf("%s: %d connections opened after an idle one, which is still open; want it closed to make room", l.name, daemon.MaxExtraConnections)
		}
	}
}

// CONFIG_TYPE=FILE with a config directory that does not exist at start
// (a volume mounted later, a deploy that makes it): rls starts with no
// limits, as the reference does, and loads the directory when it comes.
// The watch gave up at start, and the directory was never loaded.
func TestCompatConfigDirectoryMadeAfterStart(t *testing.T) {
	rds := redistest.Start(t)
	root := filepath.Join(t.TempDir(), "data")
	grpcAddr, httpAddr := servetest.Addr(t), servetest.Addr(t)
	host, port := hostPort(t, httpAddr)
	grpcHost, grpcPort := hostPort(t, grpcAddr)
	env := []string{
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(),
		"HOST=" + host, "PORT=" + port, "GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
	}
	s := launchCompat(t, env, grpcAddr, httpAddr)
	s.waitUntil(t, "GET /healthcheck answers 200", func() bool {
		code, _ := httpGet(t, "http://"+httpAddr+"/healthcheck")
		return code == 200
	})
	cl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	limited := func() bool {
		resp, err := cl.ShouldRateLimit(context.Background(), rlRequest("d", "k", "v"))
		if err != nil {
			t.Fatalf("ShouldRateLimit(d, k=v): %v", err)
		}
		return resp.GetStatuses()[0].GetCurrentLimit() != nil
	}
	if limited() {
		t.Fatal("a limit applies before the config directory exists")
	}
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	s.waitUntil(t, "the limit of the directory made after the start applies", limited)
}

// scrapeLines returns the series lines of the metrics at url by series
// (name and labels as written) to value.
func scrapeLines(t *testing.T, url string) map[string]string {
	t.Helper()
	code, body := httpGet(t, url)
	if code != 200 {
		t.Fatalf("GET %s = %d %q", url, code, body)
	}
	out := map[string]string{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			out[line[:i]] = line[i+1:]
		}
	}
	return out
}

// In compatibility mode with LOCAL_CACHE_SIZE_IN_BYTES, the denial cache
// is the reference's local cache: its counters are the ratelimit.localcache
// gauges under the names the reference's Prometheus sink gives them, a
// denial it answers counts in over_limit_with_local_cache; EXTRA_TAGS label
// every series PROMETHEUS_ADDR serves. None of them was exported.
// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: denials whose hits count go to
// Redis, so only then does the cache answer.)
func TestCompatLocalCacheStatsAndExtraTags(t *testing.T) {
	rds := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	grpcAddr, httpAddr, promAddr := servetest.Addr(t), servetest.Addr(t), servetest.Addr(t)
	host, port := hostPort(t, httpAddr)
	grpcHost, grpcPort := hostPort(t, grpcAddr)
	env := []string{
		"RUNTIME_ROOT=" + root, "USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(),
		"LOCAL_CACHE_SIZE_IN_BYTES=1048576", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true",
		"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=" + promAddr, "EXTRA_TAGS=env:prod,build:abc",
		"HOST=" + host, "PORT=" + port, "GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
	}
	s := launchCompat(t, env, grpcAddr, httpAddr)
	s.waitUntil(t, "GET /healthcheck answers 200", func() bool {
		code, _ := httpGet(t, "http://"+httpAddr+"/healthcheck")
		return code == 200
	})
	cl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	prom := "http://" + promAddr + "/metrics"
	const tags = `build="abc",env="prod"`
	requests, over := 0, 0
	// The cache keeps denials once Redis's notices of freed hits are
	// followed, soon after the start: ask until one is answered from it.
	s.waitUntil(t, "a denial answered from the denial cache", func() bool {
		resp, err := cl.ShouldRateLimit(context.Background(), rlRequest("d", "k", "v"))
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		requests++
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			over++
		}
		return scrapeLines(t, prom)["ratelimit_localcache_hitCount{"+tags+"}"] == "1"
	})
	got := scrapeLines(t, prom)
	for series, want := range map[string]int{
		"ratelimit_localcache_lookupCount{" + tags + "}":                                                               requests,
		"ratelimit_localcache_hitCount{" + tags + "}":                                                                  1,
		"ratelimit_localcache_missCount{" + tags + "}":                                                                 requests - 1,
		"ratelimit_localcache_entryCount{" + tags + "}":                                                                1,
		"ratelimit_localcache_evacuateCount{" + tags + "}":                                                             0,
		`ratelimit_service_rate_limit_over_limit_with_local_cache{build="abc",domain="d",env="prod",key1="k",key2=""}`: 1,
		`ratelimit_service_rate_limit_over_limit{build="abc",domain="d",env="prod",key1="k",key2=""}`:                  over,
		`ratelimit_service_rate_limit_total_hits{build="abc",domain="d",env="prod",key1="k",key2=""}`:                  requests,
	} {
		if g, ok := got[series]; !ok || g != strconv.Itoa(want) {
			t.Errorf("PROMETHEUS_ADDR: %s = %q (present %v), want %d", series, g, ok, want)
		}
	}
	if over != requests-1 {
		t.Errorf("%d requests on a limit of 1 per hour: %d denied, want %d", requests, over, requests-1)
	}
	for series := range got {
		if !strings.Contains(series, `env="prod"`) {
			t.Errorf("PROMETHEUS_ADDR: %s has no EXTRA_TAGS label", series)
		}
	}
	// The HTTP port's /metrics is rls's own: no EXTRA_TAGS there.
	if v := scrapeLines(t, "http://"+httpAddr+"/metrics")["ratelimit_localcache_hitCount"]; v != "1" {
		t.Errorf("the HTTP port's /metrics: ratelimit_localcache_hitCount = %q, want 1 with no labels", v)
	}
}
