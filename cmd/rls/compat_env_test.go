package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"maps"
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

// The reference's defaults and variables become rls's settings.
func TestCompatFromEnvMapping(t *testing.T) {
	o, err := compatFromEnv([]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_AUTH=u:p", "REDIS_TLS=true",
		"REDIS_TLS_CACERT=/certs/ca.crt", "REDIS_TLS_CLIENT_CERT=/certs/tls.crt", "REDIS_TLS_CLIENT_KEY=/certs/tls.key",
		"CACHE_KEY_PREFIX=eg:", "LOCAL_CACHE_SIZE_IN_BYTES=1048576", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-Left", "SHADOW_MODE=true", "QUOTA_MODE=true",
		"RESPONSE_DYNAMIC_METADATA=true", "LOG_LEVEL=debug", "LOG_FORMAT=json", "RUNTIME_ROOT=/srv", "RUNTIME_SUBDIRECTORY=rl",
		"MERGE_DOMAIN_CONFIG=true", "NEAR_LIMIT_RATIO=0.5", "REDIS_POOL_SIZE=7", "EXPIRATION_JITTER_MAX_SECONDS=60", "TRACING_ENABLED=true"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"http address", o.httpAddr, "0.0.0.0:8080"},
		{"gRPC address", o.grpcAddr, "0.0.0.0:8081"},
		{"debug address", o.compat.debugAddr, "0.0.0.0:6070"},
		{"store", o.store, "redis"},
		{"Redis URL", o.redisURL, "rediss://u:p@redis:6379/0"},
		{"Redis CA", o.redisCA, "/certs/ca.crt"},
		{"Redis client certificate", o.redisCert + " " + o.redisKey, "/certs/tls.crt /certs/tls.key"},
		{"key prefix", o.redisPrefix, "eg:"},
		{"pool", o.redisPoolSize, 7},
		{"deny cache", o.denyCache, true},
		{"denied hits count", o.countDeniedHits, false},
		{"remaining header", o.reference.answers.LimitHeaders.Remaining, "X-Left"},
		{"limit header", o.reference.answers.LimitHeaders.Limit, "RateLimit-Limit"},
		{"global shadow", o.reference.answers.Shadow, true},
		{"global quota", o.reference.quotaAll, true},
		{"dynamic metadata", o.reference.answers.DynamicMetadata, true},
		{"near-limit ratio", o.reference.nearLimitRatio, 0.5},
		{"log level", o.logLevel, slog.LevelDebug},
		{"log format", o.logFormat, "json"},
		{"config path", o.config, filepath.Join("/srv", "rl", "config")},
		{"merge domains", o.configLimits.Parse.MergeDomains, true},
		{"xDS", o.compat.xds == nil, true},
		{"prometheus", o.compat.promAddr, ""},
		{"ignored", strings.Join(o.compat.ignored, "|"), "EXPIRATION_JITTER_MAX_SECONDS: " + ignoredWhy("EXPIRATION_JITTER_MAX_SECONDS") + "|TRACING_ENABLED: rls does not export traces"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	o, err = compatFromEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.redisURL != "unix:///var/run/nutcracker/ratelimit.sock" || !o.countDeniedHits || o.denyCache || o.logLevel != slog.LevelWarn {
		t.Errorf("defaults: Redis %q, denied hits count %v, deny cache %v, log level %v; want the reference's unix socket, true, false, WARN",
			o.redisURL, o.countDeniedHits, o.denyCache, o.logLevel)
	}
	o, err = compatFromEnv([]string{"REDIS_TYPE=CLUSTER", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=a:1,b:2", "USE_PROMETHEUS=true"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.redisCluster, ",") != "a:1,b:2" || o.compat.promAddr != ":9090" || o.compat.promPath != "/metrics" {
		t.Errorf("cluster %v, prometheus %q %q", o.redisCluster, o.compat.promAddr, o.compat.promPath)
	}
}

func ignoredWhy(name string) string {
	for _, ig := range compatIgnored {
		if ig.name == name {
			return ig.why
		}
	}
	return ""
}

// A variable rls cannot honour stops the start with a message naming it.
func TestCompatRefusedVariables(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want string
	}{
		{"BACKEND_TYPE=memcache", `BACKEND_TYPE="memcache": rls stores counters in Redis`},
		{"REDIS_TYPE=sentinel", `REDIS_URL="/var/run/nutcracker/ratelimit.sock": not master,host:port,...`},
		{"REDIS_TYPE=cluster REDIS_URL=,", `REDIS_URL=",": not h:p,h:p,...`},
		{"REDIS_PERSECOND=true REDIS_PERSECOND_TYPE=memcache", `REDIS_PERSECOND_TYPE="memcache": not single, sentinel or cluster`},
		{"REDIS_PERSECOND=true REDIS_PERSECOND_SOCKET_TYPE=udp", `REDIS_PERSECOND_SOCKET_TYPE="udp": not tcp or unix`},
		{"REDIS_PERSECOND=true REDIS_PERSECOND_TLS=true", `REDIS_PERSECOND_TLS="true": TLS over a unix socket`},
		{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=maybe", `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION="maybe"`},
		{"GRPC_UDS=/tmp/s", `GRPC_UDS="/tmp/s"`},
		{"CONFIG_TYPE=GRPC_XDS_DELTA", `CONFIG_TYPE="GRPC_XDS_DELTA": not FILE or GRPC_XDS_SOTW`},
		{"LOG_LEVEL=loud", `LOG_LEVEL="loud"`},
		{"NEAR_LIMIT_RATIO=2", `NEAR_LIMIT_RATIO="2"`},
		{"GRPC_SERVER_USE_TLS=true", `needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY`},
	} {
		env := strings.Fields(tc.env)
		if strings.HasPrefix(tc.env, "CONFIG_GRPC") {
			env = append(env, "CONFIG_TYPE=GRPC_XDS_SOTW")
		}
		_, err := compatFromEnv(env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.env, err, tc.want)
		}
		if err != nil && exitCode(err) != 2 {
			t.Errorf("%s: exit code %d, want 2", tc.env, exitCode(err))
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

// GRPC_CLIENT_TLS_SAN matches any of a certificate's names, and only those.
func TestHasSAN(t *testing.T) {
	pki := testpki.New(t)
	pair, err := tls.LoadX509KeyPair(pki.Cert, pki.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		san  string
		want bool
	}{{"envoy-gateway", true}, {"localhost", true}, {"127.0.0.1", true}, {"envoy-ratelimit", false}, {"other", false}} {
		if got := hasSAN(cert, tc.san); got != tc.want {
			t.Errorf("hasSAN(cert, %q) = %v, want %v", tc.san, got, tc.want)
		}
	}
}

// CONFIG_GRPC_XDS_NODE_METADATA is read as the reference reads it:
// k1=v1,k2=v2, string values split at the first '=', items without one
// skipped.
func TestCompatNodeMetadata(t *testing.T) {
	o, err := compatFromEnv([]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA=cluster=eg,zone=a=b,junk,empty="})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for k, v := range o.compat.xds.NodeMetadata.GetFields() {
		got[k] = v.GetStringValue()
	}
	if want := map[string]string{"cluster": "eg", "zone": "a=b", "empty": ""}; !maps.Equal(got, want) {
		t.Errorf("node metadata = %v, want %v", got, want)
	}
}

// LOCAL_CACHE_SIZE_IN_BYTES turns the denial cache on above 0, bounded to
// what that memory holds (freecache's floor of 512 KiB included); 0 turns
// it off. Its size was not used.
func TestCompatLocalCacheSize(t *testing.T) {
	for _, tc := range []struct {
		env     string
		on      bool
		entries int
	}{
		{"LOCAL_CACHE_SIZE_IN_BYTES=0", false, 0},
		{"LOCAL_CACHE_SIZE_IN_BYTES=1", true, freecacheMinBytes / denyCacheEntryBytes},
		{"LOCAL_CACHE_SIZE_IN_BYTES=1048576", true, 1048576 / denyCacheEntryBytes},
		{"LOCAL_CACHE_SIZE_IN_BYTES=104857600", true, 104857600 / denyCacheEntryBytes},
	} {
		o, err := compatFromEnv([]string{tc.env})
		if err != nil {
			t.Fatalf("%s: %v", tc.env, err)
		}
		if o.denyCache != tc.on || o.compat.denyCacheSizeOf() != tc.entries {
			t.Errorf("%s: deny cache %v with %d entries, want %v with %d", tc.env, o.denyCache, o.compat.denyCacheSizeOf(), tc.on, tc.entries)
		}
	}
	if got := denyCacheEntries(1048576); got != 4096 {
		t.Errorf("1 MiB holds %d denials, want 4096 (256 bytes each)", got)
	}
}

// EXTRA_TAGS is read as the reference reads it (k:v,k:v; a later key
// wins; an empty key or value dropped), into Prometheus labels; an item
// that is not key:value, a name that is no label name or one the series
// have already stops the start, naming the variable. It was ignored.
func TestCompatExtraTags(t *testing.T) {
	for _, tc := range []struct {
		value, want, err string
	}{
		{"", "", ""},
		{"env:prod,build:abc", "build=abc env=prod", ""},
		{"env:prod,env:dev", "env=dev", ""},
		{"env:,:x,zone:a", "zone=a", ""},
		{"version:1.2.3", "version=1.2.3", ""},
		{"a:b:c", "", `item "a:b:c" is not key:value`},
		{"env", "", `item "env" is not key:value`},
		{"1x:v", "", `"1x" is not a Prometheus label name`},
		{"__name__:v", "", `"__name__" is not a Prometheus label name`},
		{"domain:v", "", `"domain" is a label of the series already`},
	} {
		o, err := compatFromEnv([]string{"USE_PROMETHEUS=true", "EXTRA_TAGS=" + tc.value})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), "EXTRA_TAGS=") || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("EXTRA_TAGS=%q: err = %v, want one naming EXTRA_TAGS and saying %s", tc.value, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("EXTRA_TAGS=%q: %v", tc.value, err)
		}
		var got []string
		for _, tg := range o.compat.extraTags {
			got = append(got, tg.name+"="+tg.value)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("EXTRA_TAGS=%q: tags %q, want %q", tc.value, strings.Join(got, " "), tc.want)
		}
	}
	o, err := compatFromEnv([]string{"EXTRA_TAGS=env:prod"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.compat.extraTags) != 0 || !slices.ContainsFunc(o.compat.ignored, func(s string) bool { return strings.HasPrefix(s, "EXTRA_TAGS: ") }) {
		t.Errorf("EXTRA_TAGS without USE_PROMETHEUS: tags %v, ignored %q; want none, and EXTRA_TAGS listed as ignored", o.compat.extraTags, o.compat.ignored)
	}
}

// REDIS_TYPE=sentinel and REDIS_PERSECOND=true are read as the reference
// reads them (its integration tests' settings): the master's name and the
// sentinels in REDIS_URL, REDIS_AUTH for the master, REDIS_SENTINEL_AUTH
// (pass or user:pass) for the sentinels; the per-second Redis from
// REDIS_PERSECOND_*, with the REDIS_TLS_* files when REDIS_PERSECOND_TLS
// says so. A cluster or Sentinel is reached over TCP whatever the socket
// type, as the reference's client reaches them.
func TestCompatSentinelAndPerSecond(t *testing.T) {
	o, err := compatFromEnv([]string{
		"REDIS_TYPE=SENTINEL", "REDIS_URL=mymaster,localhost:26394,localhost:26395,localhost:26396", "REDIS_AUTH=password123",
		"REDIS_SENTINEL_AUTH=watcher:s3cret", "REDIS_POOL_SIZE=4",
		"REDIS_TLS_CACERT=/certs/ca.crt", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true",
		"REDIS_PERSECOND=true", "REDIS_PERSECOND_TYPE=sentinel", "REDIS_PERSECOND_URL=mymaster,localhost:26399,localhost:26400",
		"REDIS_PERSECOND_AUTH=password456", "REDIS_PERSECOND_SENTINEL_AUTH=justapass", "REDIS_PERSECOND_TLS=true",
		"REDIS_PERSECOND_POOL_SIZE=3", "REDIS_PERSECOND_TIMEOUT=2s",
	})
	if err != nil {
		t.Fatal(err)
	}
	ps := o.redisPerSecond
	if ps == nil {
		t.Fatal("REDIS_PERSECOND=true: no per-second Redis")
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"master's name", o.redisSentinel.Master, "mymaster"},
		{"sentinels", strings.Join(o.redisSentinel.Addrs, ","), "localhost:26394,localhost:26395,localhost:26396"},
		{"sentinels' user and password", o.redisSentinel.Username + ":" + o.redisSentinel.Password, "watcher:s3cret"},
		{"master's URL (credentials; TLS off: REDIS_TLS unset)", o.redisURL, "redis://:password123@localhost:26394/0"},
		{"CA without REDIS_TLS", o.redisCA, ""},
		{"host name check", o.redisTLSSkipHostname, false},
		{"pool", o.redisPoolSize, 4},
		{"per-second master's name", ps.sentinel.Master, "mymaster"},
		{"per-second sentinels", strings.Join(ps.sentinel.Addrs, ","), "localhost:26399,localhost:26400"},
		{"per-second sentinels' password", ps.sentinel.Username + ":" + ps.sentinel.Password, ":justapass"},
		{"per-second URL", ps.url, "rediss://:password456@localhost:26399/0"},
		{"per-second CA (REDIS_PERSECOND_TLS)", ps.ca, "/certs/ca.crt"},
		{"per-second host name check", ps.skipHostname, true},
		{"per-second pool", ps.poolSize, 3},
		{"ignored", strings.Join(o.compat.ignored, "|"), "REDIS_PERSECOND_TIMEOUT: " + ignoredWhy("REDIS_PERSECOND_*")},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}

	// A per-second cluster and a single first Redis; the socket type
	// (default unix) does not apply to a cluster.
	o, err = compatFromEnv([]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_PERSECOND=true",
		"REDIS_PERSECOND_TYPE=cluster", "REDIS_PERSECOND_URL=a:1,b:2"})
	if err != nil {
		t.Fatal(err)
	}
	if ps := o.redisPerSecond; o.redisURL != "redis://redis:6379/0" || o.redisSentinel != nil || ps == nil || strings.Join(ps.cluster, ",") != "a:1,b:2" || ps.poolSize != 10 {
		t.Errorf("per-second cluster: first %q sentinel %v, per-second %+v", o.redisURL, o.redisSentinel, ps)
	}
	// Without REDIS_PERSECOND its variables do nothing and are not logged.
	o, err = compatFromEnv([]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_PERSECOND_URL=other:6379", "REDIS_PERSECOND_TIMEOUT=1s"})
	if err != nil {
		t.Fatal(err)
	}
	if o.redisPerSecond != nil || len(o.compat.ignored) != 0 {
		t.Errorf("REDIS_PERSECOND unset: per-second %+v, ignored %q; want none", o.redisPerSecond, o.compat.ignored)
	}
	// The default per-second Redis is the reference's unix socket.
	o, err = compatFromEnv([]string{"REDIS_PERSECOND=true"})
	if err != nil {
		t.Fatal(err)
	}
	if ps := o.redisPerSecond; ps == nil || ps.url != "unix:///var/run/nutcracker/ratelimitpersecond.sock" {
		t.Errorf("REDIS_PERSECOND=true alone: per-second %+v, want the reference's socket", ps)
	}
	// A cluster over the default unix socket type is reached over TCP.
	o, err = compatFromEnv([]string{"REDIS_TYPE=cluster", "REDIS_URL=a:1,b:2"})
	if err != nil {
		t.Fatalf("REDIS_TYPE=cluster with the default socket type: %v", err)
	}
	if strings.Join(o.redisCluster, ",") != "a:1,b:2" {
		t.Errorf("cluster %v", o.redisCluster)
	}
}

// compatServe starts rls as /bin/ratelimit with env and a config file of
// the reference's format under RUNTIME_ROOT, and waits until it is healthy.
func compatServe(t *testing.T, env []string, config string) *server {
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
	env = append(env, "RUNTIME_ROOT="+root, "USE_STATSD=false", "HOST="+host, "PORT="+port,
		"GRPC_HOST="+grpcHost, "GRPC_PORT="+grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0")
	s := launchCompat(t, env, grpcAddr, httpAddr)
	s.waitUntil(t, "GET /healthcheck answers 200", func() bool { code, _ := httpGet(t, "http://"+httpAddr+"/healthcheck"); return code == 200 })
	return s
}

// redisKeys returns the keys of a Redis (through Do: AUTH when it has a
// password) that start with rls:, sorted.
func redisKeys(t *testing.T, srv *redistest.Server) []string {
	t.Helper()
	out, err := srv.Do("KEYS", "rls:*")
	if err != nil {
		t.Fatal(err)
	}
	keys := strings.Fields(out)
	slices.Sort(keys)
	return keys
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
	if got, want := redisKeys(t, st.Master()), []string{"rls:{ps/hourly=a}:fw3600s", "rls:{ps/hourly=a}:fw3600s:s"}; !slices.Equal(got, want) {
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
