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
		{"remaining header", o.reference.LimitHeaders.Remaining, "X-Left"},
		{"limit header", o.reference.LimitHeaders.Limit, "RateLimit-Limit"},
		{"global shadow", o.reference.GlobalShadow, true},
		{"global quota", o.reference.GlobalQuota, true},
		{"dynamic metadata", o.reference.DynamicMetadata, true},
		{"near-limit ratio", o.reference.Stats.NearLimitRatio, 0.5},
		{"log level", o.logLevel, slog.LevelDebug},
		{"log format", o.logFormat, "json"},
		{"config path", o.config, filepath.Join("/srv", "rl", "config")},
		{"merge domains", o.configLimits.Reference.MergeDomains, true},
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
		{"REDIS_TYPE=sentinel", `REDIS_TYPE="sentinel": Redis Sentinel is not supported`},
		{"REDIS_PERSECOND=true", `REDIS_PERSECOND="true": rls keeps all windows`},
		{"GRPC_UDS=/tmp/s", `GRPC_UDS="/tmp/s"`},
		{"CONFIG_TYPE=GRPC_XDS_DELTA", `CONFIG_TYPE="GRPC_XDS_DELTA": not FILE or GRPC_XDS_SOTW`},
		{"LOG_LEVEL=loud", `LOG_LEVEL="loud"`},
		{"NEAR_LIMIT_RATIO=2", `NEAR_LIMIT_RATIO="2"`},
		{"GRPC_SERVER_USE_TLS=true", `needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY`},
	} {
		env := []string{tc.env}
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
		b, err := os.ReadFile(filepath.Join("..", "..", "internal", "descriptors", "testdata", "envoy-ratelimit", "merge", f))
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
