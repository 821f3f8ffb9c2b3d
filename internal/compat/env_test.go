package compat

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/testpki"
	"github.com/rlsproject/rls/internal/tracing"
)

// fromEnv reads env (NAME=value items), failing the test on an error, and
// returns the settings and the server's Config.
func fromEnv(t *testing.T, env ...string) (*settings, daemon.Config) {
	t.Helper()
	s, err := readEnv(env)
	if err != nil {
		t.Fatalf("readEnv(%q): %v", env, err)
	}
	return s, s.config()
}

// listenerAddr is the address of cfg's extra listener named name; "" when
// there is none.
func listenerAddr(cfg daemon.Config, name string) string {
	for _, l := range cfg.Plugins.Listeners {
		if l.Name == name {
			return l.Addr
		}
	}
	return ""
}

// isXDS reports whether cfg's config comes from an xDS server.
func isXDS(cfg daemon.Config) bool {
	_, ok := cfg.Plugins.Source.(*xdsSource)
	return ok
}

// The reference's defaults and variables become rls's settings.
func TestCompatFromEnvMapping(t *testing.T) {
	s, o := fromEnv(t, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_AUTH=u:p", "REDIS_TLS=true",
		"REDIS_TLS_CACERT=/certs/ca.crt", "REDIS_TLS_CLIENT_CERT=/certs/tls.crt", "REDIS_TLS_CLIENT_KEY=/certs/tls.key",
		"CACHE_KEY_PREFIX=eg:", "LOCAL_CACHE_SIZE_IN_BYTES=1048576", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_REMAINING_HEADER=X-Left", "SHADOW_MODE=true", "QUOTA_MODE=true",
		"RESPONSE_DYNAMIC_METADATA=true", "LOG_LEVEL=debug", "LOG_FORMAT=json", "RUNTIME_ROOT=/srv", "RUNTIME_SUBDIRECTORY=rl",
		"MERGE_DOMAIN_CONFIG=true", "NEAR_LIMIT_RATIO=0.5", "REDIS_POOL_SIZE=7", "EXPIRATION_JITTER_MAX_SECONDS=60", "TRACING_SERVICE_NAME=rl")
	answers := s.answers()
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"http address", o.Listeners.HTTPAddr, "0.0.0.0:8080"},
		{"gRPC address", o.Listeners.GRPCAddr, "0.0.0.0:8081"},
		{"debug address", listenerAddr(o, "DEBUG_HOST:DEBUG_PORT"), "0.0.0.0:6070"},
		{"store", string(o.Store.Kind), "redis"},
		{"Redis URL", o.Store.Redis.URL, "rediss://u:p@redis:6379/0"},
		{"Redis CA", o.Store.Redis.CAFile, "/certs/ca.crt"},
		{"Redis client certificate", o.Store.Redis.CertFile + " " + o.Store.Redis.KeyFile, "/certs/tls.crt /certs/tls.key"},
		{"key prefix", o.Store.Redis.Prefix, "eg:"},
		{"pool", o.Store.Redis.PoolSize, 7},
		{"deny cache", o.Store.Redis.DenyCache, true},
		{"denied hits count", o.Service.CountDeniedHits, false},
		{"remaining header", answers.LimitHeaders.Remaining, "X-Left"},
		{"limit header", answers.LimitHeaders.Limit, "RateLimit-Limit"},
		{"global shadow", answers.Shadow, true},
		{"global quota", o.Service.QuotaAll, true},
		{"dynamic metadata", answers.DynamicMetadata, true},
		{"near-limit ratio", s.nearLimitRatio, 0.5},
		{"log level", o.Logging.Level, slog.LevelDebug},
		{"log format", o.Logging.Format, "json"},
		{"config path", o.Files.Path, filepath.Join("/srv", "rl", "config")},
		{"merge domains", o.Files.Limits.Parse.MergeDomains, true},
		{"xDS", isXDS(o), false},
		{"prometheus", listenerAddr(o, "PROMETHEUS_ADDR"), ""},
		{"ignored", strings.Join(s.ignored, "|"), "EXPIRATION_JITTER_MAX_SECONDS: " + ignoredWhy("EXPIRATION_JITTER_MAX_SECONDS") + "|TRACING_SERVICE_NAME: " + ignoredWhy("TRACING_*")},
		{"tracing", o.Tracing.On(), false},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	_, o = fromEnv(t)
	if o.Store.Redis.URL != "unix:///var/run/nutcracker/ratelimit.sock" || !o.Service.CountDeniedHits || o.Store.Redis.DenyCache || o.Logging.Level != slog.LevelWarn {
		t.Errorf("defaults: Redis %q, denied hits count %v, deny cache %v, log level %v; want the reference's unix socket, true, false, WARN",
			o.Store.Redis.URL, o.Service.CountDeniedHits, o.Store.Redis.DenyCache, o.Logging.Level)
	}
	s, o = fromEnv(t, "REDIS_TYPE=CLUSTER", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=a:1,b:2", "USE_PROMETHEUS=true")
	if strings.Join(o.Store.Redis.ClusterSeeds, ",") != "a:1,b:2" || listenerAddr(o, "PROMETHEUS_ADDR") != ":9090" || s.promPath != "/metrics" {
		t.Errorf("cluster %v, prometheus %q %q", o.Store.Redis.ClusterSeeds, listenerAddr(o, "PROMETHEUS_ADDR"), s.promPath)
	}
}

// TRACING_ENABLED=true exports spans as the reference does: OTLP over HTTP
// to the exporter's default endpoint with TLS, unless the variables say
// otherwise; with it unset, the TRACING_ and OTEL_ variables are ignored.
func TestCompatTracing(t *testing.T) {
	_, o := fromEnv(t, "TRACING_ENABLED=true")
	tr := o.Tracing
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"on", tr.On(), true},
		{"endpoint", tr.Endpoint, "localhost:4318"},
		{"protocol", tr.Protocol, tracing.HTTP},
		{"TLS", tr.TLS, tracing.TLSOn},
		{"service", tr.ServiceName, "RateLimit"},
		{"instance id is a UUID", len(tr.ServiceInstanceID) == 36 && strings.Count(tr.ServiceInstanceID, "-") == 4, true},
		{"sampler", tr.Sampler.Description(), "TraceIDRatioBased{1}"},
	} {
		if c.got != c.want {
			t.Errorf("TRACING_ENABLED=true: %s = %v, want %v", c.what, c.got, c.want)
		}
	}

	s, o := fromEnv(t, "TRACING_ENABLED=true", "TRACING_EXPORTER_PROTOCOL=GRPC", "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317",
		"TRACING_SAMPLING_RATE=0.25", "TRACING_SERVICE_NAME=rl", "TRACING_SERVICE_NAMESPACE=gw", "TRACING_SERVICE_INSTANCE_ID=rl-0",
		"OTEL_EXPORTER_OTLP_INSECURE=true", "OTEL_EXPORTER_OTLP_HEADERS=a=b")
	tr = o.Tracing
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"endpoint", tr.Endpoint + " " + tr.BaseEndpoint, " http://collector:4317"},
		{"protocol", tr.Protocol, tracing.GRPC},
		{"TLS", tr.TLS, tracing.TLSOff},
		{"service", tr.ServiceName + " " + tr.ServiceNamespace + " " + tr.ServiceInstanceID, "rl gw rl-0"},
		{"sampler", tr.Sampler.Description(), "TraceIDRatioBased{0.25}"},
		// The exporter reads the other OTEL_EXPORTER_OTLP_ variables.
		{"ignored", strings.Join(s.ignored, "|"), ""},
	} {
		if c.got != c.want {
			t.Errorf("TRACING_ENABLED=true with settings: %s = %v, want %v", c.what, c.got, c.want)
		}
	}

	s, o = fromEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317", "TRACING_SAMPLING_RATE=0.5")
	if o.Tracing.On() {
		t.Errorf("TRACING_ENABLED unset: tracing %+v, want off", o.Tracing)
	}
	want := "OTEL_EXPORTER_OTLP_ENDPOINT: " + ignoredWhy("OTEL_*") + "|TRACING_SAMPLING_RATE: " + ignoredWhy("TRACING_*")
	if got := strings.Join(s.ignored, "|"); got != want {
		t.Errorf("TRACING_ENABLED unset: ignored %q, want %q", got, want)
	}
}

// ignoredWhy is why the table says rls ignores the variable name.
func ignoredWhy(name string) string {
	for _, r := range (&settings{}).table() {
		if r.name == name && r.ignored != "" {
			return r.ignored
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
		{"TRACING_ENABLED=true TRACING_EXPORTER_PROTOCOL=thrift", `TRACING_EXPORTER_PROTOCOL="thrift": not http or grpc`},
		{"TRACING_ENABLED=true OTEL_EXPORTER_OTLP_ENDPOINT=collector", `OTEL_EXPORTER_OTLP_ENDPOINT="collector": not host:port or an http:// or https:// URL`},
		{"TRACING_ENABLED=true OTEL_EXPORTER_OTLP_TRACES_INSECURE=maybe", `OTEL_EXPORTER_OTLP_TRACES_INSECURE="maybe": not true or false`},
		{"TRACING_ENABLED=true TRACING_SAMPLING_RATE=half", `TRACING_SAMPLING_RATE="half"`},
		{"USE_DOG_STATSD=true USE_STATSD=true", `USE_DOG_STATSD="true": only one stats sink may be on`},
		{"STATSD_PORT=99999", `STATSD_PORT="99999": not a port number`},
		{"USE_DOG_STATSD=true USE_DOG_STATSD_MOGRIFIERS=X", `DOG_STATSD_MOGRIFIER_X_PATTERN="": empty or unset`},
	} {
		env := strings.Fields(tc.env)
		if strings.HasPrefix(tc.env, "CONFIG_GRPC") {
			env = append(env, "CONFIG_TYPE=GRPC_XDS_SOTW")
		}
		_, err := FromEnv(env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.env, err, tc.want)
		}
		// An *envError: a variable rls cannot take, which cmd/rls answers
		// with exit code 2 (TestCompatRefusedExitCode).
		if e := (*envError)(nil); err != nil && !errors.As(err, &e) {
			t.Errorf("%s: err = %T, want an *envError (a usage error, exit code 2)", tc.env, err)
		}
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
	_, o := fromEnv(t, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_METADATA=cluster=eg,zone=a=b,junk,empty=")
	got := map[string]string{}
	for k, v := range o.Plugins.Source.(*xdsSource).opts.NodeMetadata.GetFields() {
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
		_, o := fromEnv(t, tc.env)
		if r := o.Store.Redis; r.DenyCache != tc.on || r.DenyCacheSize != tc.entries {
			t.Errorf("%s: deny cache %v with %d entries, want %v with %d", tc.env, r.DenyCache, r.DenyCacheSize, tc.on, tc.entries)
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
		s, err := readEnv([]string{"USE_PROMETHEUS=true", "EXTRA_TAGS=" + tc.value})
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
		for _, tg := range s.extraTags {
			got = append(got, tg.name+"="+tg.value)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("EXTRA_TAGS=%q: tags %q, want %q", tc.value, strings.Join(got, " "), tc.want)
		}
	}
	for _, env := range [][]string{{"USE_STATSD=false"}, {"DISABLE_STATS=true", "USE_PROMETHEUS=true"}} {
		s, _ := fromEnv(t, append(env, "EXTRA_TAGS=env:prod")...)
		if len(s.extraTags) != 0 || !slices.ContainsFunc(s.ignored, func(s string) bool { return strings.HasPrefix(s, "EXTRA_TAGS: ") }) {
			t.Errorf("EXTRA_TAGS with %q: tags %v, ignored %q; want none, and EXTRA_TAGS listed as ignored", env, s.extraTags, s.ignored)
		}
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
	s, o := fromEnv(t,
		"REDIS_TYPE=SENTINEL", "REDIS_URL=mymaster,localhost:26394,localhost:26395,localhost:26396", "REDIS_AUTH=password123",
		"REDIS_SENTINEL_AUTH=watcher:s3cret", "REDIS_POOL_SIZE=4",
		"REDIS_TLS_CACERT=/certs/ca.crt", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true",
		"REDIS_PERSECOND=true", "REDIS_PERSECOND_TYPE=sentinel", "REDIS_PERSECOND_URL=mymaster,localhost:26399,localhost:26400",
		"REDIS_PERSECOND_AUTH=password456", "REDIS_PERSECOND_SENTINEL_AUTH=justapass", "REDIS_PERSECOND_TLS=true",
		"REDIS_PERSECOND_POOL_SIZE=3", "REDIS_PERSECOND_TIMEOUT=2s",
	)
	r := o.Store.Redis
	ps := r.PerSecond
	if ps == nil {
		t.Fatal("REDIS_PERSECOND=true: no per-second Redis")
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"master's name", r.Sentinel.Master, "mymaster"},
		{"sentinels", strings.Join(r.Sentinel.Addrs, ","), "localhost:26394,localhost:26395,localhost:26396"},
		{"sentinels' user and password", r.Sentinel.Username + ":" + r.Sentinel.Password, "watcher:s3cret"},
		{"master's URL (credentials; TLS off: REDIS_TLS unset)", r.URL, "redis://:password123@localhost:26394/0"},
		{"CA without REDIS_TLS", r.CAFile, ""},
		{"host name check", r.TLSSkipHostname, false},
		{"pool", r.PoolSize, 4},
		{"per-second master's name", ps.Sentinel.Master, "mymaster"},
		{"per-second sentinels", strings.Join(ps.Sentinel.Addrs, ","), "localhost:26399,localhost:26400"},
		{"per-second sentinels' password", ps.Sentinel.Username + ":" + ps.Sentinel.Password, ":justapass"},
		{"per-second URL", ps.URL, "rediss://:password456@localhost:26399/0"},
		{"per-second CA (REDIS_PERSECOND_TLS)", ps.CAFile, "/certs/ca.crt"},
		{"per-second host name check", ps.TLSSkipHostname, true},
		{"per-second pool", ps.PoolSize, 3},
		{"ignored", strings.Join(s.ignored, "|"), "REDIS_PERSECOND_TIMEOUT: " + ignoredWhy("REDIS_PERSECOND_*")},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}

	// A per-second cluster and a single first Redis; the socket type
	// (default unix) does not apply to a cluster.
	_, o = fromEnv(t, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_PERSECOND=true",
		"REDIS_PERSECOND_TYPE=cluster", "REDIS_PERSECOND_URL=a:1,b:2")
	if r, ps := o.Store.Redis, o.Store.Redis.PerSecond; r.URL != "redis://redis:6379/0" || r.Sentinel != nil || ps == nil || strings.Join(ps.ClusterSeeds, ",") != "a:1,b:2" || ps.PoolSize != 10 {
		t.Errorf("per-second cluster: first %q sentinel %v, per-second %+v", r.URL, r.Sentinel, ps)
	}
	// Without REDIS_PERSECOND its variables do nothing and are not logged.
	s, o = fromEnv(t, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379", "REDIS_PERSECOND_URL=other:6379", "REDIS_PERSECOND_TIMEOUT=1s")
	if o.Store.Redis.PerSecond != nil || len(s.ignored) != 0 {
		t.Errorf("REDIS_PERSECOND unset: per-second %+v, ignored %q; want none", o.Store.Redis.PerSecond, s.ignored)
	}
	// The default per-second Redis is the reference's unix socket.
	_, o = fromEnv(t, "REDIS_PERSECOND=true")
	if ps := o.Store.Redis.PerSecond; ps == nil || ps.URL != "unix:///var/run/nutcracker/ratelimitpersecond.sock" {
		t.Errorf("REDIS_PERSECOND=true alone: per-second %+v, want the reference's socket", ps)
	}
	// A cluster over the default unix socket type is reached over TCP.
	_, o = fromEnv(t, "REDIS_TYPE=cluster", "REDIS_URL=a:1,b:2")
	if strings.Join(o.Store.Redis.ClusterSeeds, ",") != "a:1,b:2" {
		t.Errorf("cluster %v", o.Store.Redis.ClusterSeeds)
	}
}
