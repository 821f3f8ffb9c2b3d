package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/compat"
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tlsfiles"
	"github.com/rlsproject/rls/internal/xdsconfig"
)

// compatEnvoyRatelimit is the --compat mode that reads envoyproxy/ratelimit's
// environment (DESIGN §9).
const compatEnvoyRatelimit = "envoy-ratelimit"

// compatName is the program name under which rls starts in that mode, as
// images that run /bin/ratelimit (Envoy Gateway) call it.
const compatName = "ratelimit"

// compatArgs returns the arguments of run for a process started as argv0
// with args: under the name ratelimit, `serve --compat envoy-ratelimit`
// (the reference takes no arguments); otherwise args as they are.
func compatArgs(argv0 string, args []string) []string {
	if filepath.Base(argv0) != compatName {
		return args
	}
	return append([]string{"serve", "--compat", compatEnvoyRatelimit}, args...)
}

// referenceOptions are the behaviours of envoyproxy/ratelimit asked for
// (its environment in compatibility mode; --reference-stats in rls's own):
// its stats, its answer rules and QUOTA_MODE.
type referenceOptions struct {
	stats          bool
	nearLimitRatio float64 // 0: the reference's default
	answers        compat.Answers
	quotaAll       bool
}

// plug adds what r asks for to opts, registering the stats in reg.
func (r referenceOptions) plug(opts *service.Options, reg prometheus.Registerer) {
	answers := r.answers
	if r.stats {
		st := compat.NewStats(reg, r.nearLimitRatio, opts.MaxValueSeries)
		opts.Observers = append(opts.Observers, st)
		answers.Stats = st
	}
	if answers.Shadow || answers.DynamicMetadata || answers.LimitHeaders != nil {
		opts.AnswerRules = append(opts.AnswerRules, &answers)
	}
	opts.QuotaAll = r.quotaAll
}

// compatOptions are the settings of envoyproxy/ratelimit's environment
// that rls's own flags do not hold.
type compatOptions struct {
	// xds is the xDS client's settings under CONFIG_TYPE=GRPC_XDS_SOTW; nil
	// under CONFIG_TYPE=FILE.
	xds *xdsconfig.Options
	// forceStart: ready (and /healthcheck 200) before a first config, with
	// an empty one (FORCE_START_WITHOUT_INITIAL_CONFIG).
	forceStart bool
	// debugAddr serves /rlconfig and /debug/pprof (DEBUG_HOST:DEBUG_PORT).
	debugAddr string
	// promAddr and promPath serve the metrics (USE_PROMETHEUS); promAddr
	// is empty when off.
	promAddr, promPath string
	// clientSAN is a name a client certificate must carry
	// (GRPC_CLIENT_TLS_SAN).
	clientSAN string
	// extraTags are labels put on every series that PROMETHEUS_ADDR
	// serves (EXTRA_TAGS), sorted by name.
	extraTags []tag
	// denyCacheSize bounds the denial cache's entries
	// (LOCAL_CACHE_SIZE_IN_BYTES; 0 when it is off).
	denyCacheSize int
	// ignored are the variables set that rls does not use, with why; they
	// are logged once at start.
	ignored []string
}

// compatEnv reads env as envoyproxy/ratelimit does (settings.go): a
// variable counts when it is set, even empty, and defaults apply
// otherwise.
type compatEnv struct {
	vars map[string]string
	err  error // the first bad value
	used map[string]bool
}

func newCompatEnv(env []string) *compatEnv {
	e := &compatEnv{vars: map[string]string{}, used: map[string]bool{}}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			e.vars[k] = v
		}
	}
	return e
}

func (e *compatEnv) str(name, def string) string {
	e.used[name] = true
	if v, ok := e.vars[name]; ok {
		return v
	}
	return def
}

func (e *compatEnv) set(name string) bool {
	_, ok := e.vars[name]
	return ok
}

func (e *compatEnv) fail(name, v, want string) {
	if e.err == nil {
		e.err = usageError{fmt.Errorf("%s=%q: %s", name, v, want)}
	}
}

func (e *compatEnv) boolean(name string, def bool) bool {
	v := e.str(name, strconv.FormatBool(def))
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.fail(name, v, "not true or false")
	}
	return b
}

func (e *compatEnv) integer(name string, def int) int {
	v := e.str(name, strconv.Itoa(def))
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		e.fail(name, v, "not a whole number")
	}
	return n
}

func (e *compatEnv) duration(name string, def time.Duration) time.Duration {
	v := e.str(name, def.String())
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		e.fail(name, v, "not a positive duration such as 10s")
	}
	return d
}

func (e *compatEnv) float(name string, def float64) float64 {
	v := e.str(name, strconv.FormatFloat(def, 'f', -1, 64))
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		e.fail(name, v, "not a number")
	}
	return f
}

// refuse stops the start when name is set to a value that rls cannot
// honour.
func (e *compatEnv) refuse(name, why string) {
	if e.err == nil {
		e.err = usageError{fmt.Errorf("%s=%q: %s", name, e.vars[name], why)}
	}
}

// compatIgnored are the reference's variables that rls reads and does not
// use, with why; a set one is logged once at start. Variables with a
// prefix end in '*'.
var compatIgnored = []struct{ name, why string }{
	{"GRPC_SERVER_TLS_CA_CERT", "client certificates are required only with GRPC_CLIENT_TLS_CACERT, as in envoyproxy/ratelimit"},
	{"GRPC_SERVER_TLS_CERT_RELOAD*", "the certificate files are re-read when they change"},
	{"RUNTIME_IGNOREDOTFILES", "rls always skips files and directories whose names start with a dot"},
	{"RUNTIME_WATCH_ROOT", "rls watches the config directory and the directories above it, so both a symlink swap and a file change reload"},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "reconnections follow XDS_CLIENT_BACKOFF_*"},
	{"USE_STATSD", "rls has no statsd sink; use USE_PROMETHEUS (the reference's stats are there under its mapping's names)"},
	{"STATSD_*", "rls has no statsd sink"},
	{"USE_DOG_STATSD*", "rls has no statsd sink"},
	{"DOG_STATSD_*", "rls has no statsd sink"},
	{"PROMETHEUS_MAPPER_YAML", "the reference's stats carry the default mapping's names and labels"},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "rls's latency histograms are in seconds"},
	{"EXTRA_TAGS", "its labels go on the series of USE_PROMETHEUS, which is off"},
	{"STATS_FLUSH_INTERVAL", "Prometheus metrics are read when scraped"},
	{"DISABLE_STATS", "metrics are served only with USE_PROMETHEUS"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "rls sets each key's expiry once, when it is created, to when its state stops meaning anything"},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "/healthcheck answers 200 once a config is loaded, or at once with FORCE_START_WITHOUT_INITIAL_CONFIG"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "/readyz and gRPC health follow Redis; /healthcheck does not, as in the reference"},
	{"REDIS_TIMEOUT", "a dial timeout there; rls bounds each decision by its store timeout (10ms) instead"},
	{"REDIS_PIPELINE_WINDOW", "rls pipelines concurrent requests by itself"},
	{"REDIS_PIPELINE_LIMIT", "rls pipelines concurrent requests by itself"},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "rls calls the masters of a request concurrently"},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "requests wait for a connection"},
	{"REDIS_STARTUP_*", "rls starts without waiting for Redis and reconnects by itself; /readyz says when Redis answers"},
	{"REDIS_PERSECOND_*", "ignored as its REDIS_ twin is (store timeout, pipelining, pool)"},
	{"MEMCACHE_*", "the memcache backend is not supported"},
	{"TRACING_*", "rls does not export traces"},
	{"OTEL_*", "rls does not export traces"},
}

// compatFromEnv builds the serve options from envoyproxy/ratelimit's
// environment (reference §1.6), with rls's defaults for what it does not
// say. A variable rls cannot honour stops the start with a message naming
// it.
func compatFromEnv(env []string) (*options, error) {
	e := newCompatEnv(env)
	fs, f := newServeFlagSet() // rls's defaults, then the environment's settings
	if err := fs.Parse(nil); err != nil {
		return nil, err
	}
	o := &f.o
	c := &compatOptions{}
	o.compat = c

	o.httpAddr = net.JoinHostPort(e.str("HOST", "0.0.0.0"), e.str("PORT", "8080"))
	o.grpcAddr = net.JoinHostPort(e.str("GRPC_HOST", "0.0.0.0"), e.str("GRPC_PORT", "8081"))
	c.debugAddr = net.JoinHostPort(e.str("DEBUG_HOST", "0.0.0.0"), e.str("DEBUG_PORT", "6070"))
	if e.set("GRPC_UDS") {
		e.refuse("GRPC_UDS", "rls serves gRPC on TCP only; use GRPC_HOST and GRPC_PORT")
	}
	o.grpcLimits.MaxConnectionAge = e.duration("GRPC_MAX_CONNECTION_AGE", grpcserver.DefaultMaxConnectionAge)
	o.grpcLimits.MaxConnectionAgeGrace = e.duration("GRPC_MAX_CONNECTION_AGE_GRACE", grpcserver.DefaultMaxConnectionAgeGrace)
	compatLogging(e, o)
	compatGRPCTLS(e, o)
	f.tlsOn = "grpc" // the HTTP listener stays plain text, as in the reference
	compatConfigSource(e, o)
	compatStats(e, o)
	compatLimiter(e, o)
	compatRedis(e, o)
	if e.err != nil {
		return nil, e.err
	}
	// Checks and defaults of the flags (limits, TLS pairing, ...).
	for _, check := range []func(bad func(string, error) error) error{f.config, f.limits, f.tls} {
		if err := check(func(name string, err error) error { return usageError{fmt.Errorf("%s: %w", name, err)} }); err != nil {
			return nil, err
		}
	}
	o.configLimits.Parse = compat.ParseOptions(e.boolean("MERGE_DOMAIN_CONFIG", false))
	if e.err != nil {
		return nil, e.err
	}
	c.ignored = ignoredVars(e)
	return o, nil
}

// ignoredVars lists the variables of compatIgnored that env sets.
func ignoredVars(e *compatEnv) []string {
	var out []string
	names := make([]string, 0, len(e.vars))
	for k := range e.vars {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, name := range names {
		if e.used[name] {
			continue
		}
		for _, ig := range compatIgnored {
			prefix, wild := strings.CutSuffix(ig.name, "*")
			if name == ig.name || (wild && strings.HasPrefix(name, prefix)) {
				out = append(out, name+": "+ig.why)
				break
			}
		}
	}
	return out
}

// compatLogging reads LOG_LEVEL (logrus's names) and LOG_FORMAT.
func compatLogging(e *compatEnv, o *options) {
	switch v := strings.ToLower(e.str("LOG_LEVEL", "WARN")); v {
	case "trace", "debug":
		o.logLevel = slog.LevelDebug
	case "info":
		o.logLevel = slog.LevelInfo
	case "warn", "warning":
		o.logLevel = slog.LevelWarn
	case "error", "fatal", "panic":
		o.logLevel = slog.LevelError
	default:
		e.fail("LOG_LEVEL", v, "not one of trace|debug|info|warn|error|fatal|panic")
	}
	o.logFormat = strings.ToLower(e.str("LOG_FORMAT", "text"))
	if o.logFormat != "text" && o.logFormat != "json" {
		e.fail("LOG_FORMAT", o.logFormat, "not text or json")
	}
}

// compatGRPCTLS reads the gRPC listener's TLS: a certificate with
// GRPC_SERVER_USE_TLS, client certificates required only with
// GRPC_CLIENT_TLS_CACERT (and then carrying GRPC_CLIENT_TLS_SAN when set).
func compatGRPCTLS(e *compatEnv, o *options) {
	if !e.boolean("GRPC_SERVER_USE_TLS", false) {
		return
	}
	o.tls.Cert = e.str("GRPC_SERVER_TLS_CERT", "")
	o.tls.Key = e.str("GRPC_SERVER_TLS_KEY", "")
	if o.tls.Cert == "" || o.tls.Key == "" {
		e.fail("GRPC_SERVER_USE_TLS", "true", "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
	}
	o.tls.ClientCA = e.str("GRPC_CLIENT_TLS_CACERT", "")
	o.compat.clientSAN = e.str("GRPC_CLIENT_TLS_SAN", "")
	if o.compat.clientSAN != "" && o.tls.ClientCA == "" {
		e.fail("GRPC_CLIENT_TLS_SAN", o.compat.clientSAN, "needs GRPC_CLIENT_TLS_CACERT (client certificates are required only with it)")
	}
}

// compatConfigSource reads where the config comes from: files under
// RUNTIME_ROOT (CONFIG_TYPE=FILE) or an xDS server (GRPC_XDS_SOTW).
func compatConfigSource(e *compatEnv, o *options) {
	c := o.compat
	c.forceStart = e.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false)
	root := e.str("RUNTIME_ROOT", "/srv/runtime_data/current")
	sub := e.str("RUNTIME_SUBDIRECTORY", "")
	app := e.str("RUNTIME_APPDIRECTORY", "config")
	switch t := strings.ToUpper(e.str("CONFIG_TYPE", "FILE")); t {
	case "FILE":
		o.config = filepath.Join(root, sub, app)
		o.watch = true
		return
	case "GRPC_XDS_SOTW":
	default:
		e.fail("CONFIG_TYPE", t, "not FILE or GRPC_XDS_SOTW")
		return
	}
	o.watch = false
	o.config = ""
	x := &xdsconfig.Options{
		Server: e.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
		NodeID: e.str("CONFIG_GRPC_XDS_NODE_ID", "default"),
		Backoff: xdsconfig.Backoff{
			Initial:      e.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", xdsconfig.DefaultBackoff.Initial),
			Max:          e.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", xdsconfig.DefaultBackoff.Max),
			RandomFactor: e.float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", xdsconfig.DefaultBackoff.RandomFactor),
			Jitter:       e.boolean("XDS_CLIENT_BACKOFF_JITTER", xdsconfig.DefaultBackoff.Jitter),
		},
		MaxMsgSize: e.integer("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0),
	}
	// As the reference reads it: k1=v1,k2=v2, string values, split at the
	// first '=', an item without one skipped.
	x.NodeMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, kv := range strings.Split(e.str("CONFIG_GRPC_XDS_NODE_METADATA", ""), ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			x.NodeMetadata.Fields[k] = structpb.NewStringValue(v)
		}
	}
	if hs := e.str("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ""); hs != "" {
		x.Headers = map[string]string{}
		for _, kv := range splitList(hs) {
			k, v, ok := strings.Cut(kv, ":")
			if !ok {
				e.fail("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", hs, "not k1:v1,k2:v2")
				break
			}
			x.Headers[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	if e.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false) {
		cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{
			CA:         e.str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ""),
			Cert:       e.str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ""),
			Key:        e.str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ""),
			ServerName: e.str("CONFIG_GRPC_XDS_SERVER_TLS_SAN", ""),
		})
		if err != nil {
			e.fail("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", err.Error())
		}
		x.TLS = cfg
	}
	c.xds = x
}

// compatStats reads USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH and
// EXTRA_TAGS.
func compatStats(e *compatEnv, o *options) {
	if !e.boolean("USE_PROMETHEUS", false) {
		return
	}
	o.compat.promAddr = e.str("PROMETHEUS_ADDR", ":9090")
	o.compat.promPath = e.str("PROMETHEUS_PATH", "/metrics")
	if !strings.HasPrefix(o.compat.promPath, "/") {
		e.fail("PROMETHEUS_PATH", o.compat.promPath, "not a path starting with /")
	}
	tags, err := parseExtraTags(e.str("EXTRA_TAGS", ""))
	if err != nil {
		e.fail("EXTRA_TAGS", e.vars["EXTRA_TAGS"], err.Error())
	}
	o.compat.extraTags = tags
}

// tag is one label of EXTRA_TAGS.
type tag struct{ name, value string }

// reservedTagNames are the label names EXTRA_TAGS may not take: the
// labels of the reference's per-limit series, and those Prometheus gives
// a meaning in histograms and summaries.
var reservedTagNames = []string{"domain", "key1", "key2", "le", "quantile"}

// parseExtraTags reads EXTRA_TAGS as the reference does (envconfig's map):
// "k:v,k:v", each item split at its one ':' (an item with none or several
// is an error: the reference does not start), a later key winning; an item
// with an empty key or value is dropped, as its stats library drops it.
// The names must be Prometheus label names. The result is sorted by name.
func parseExtraTags(v string) ([]tag, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	byName := map[string]string{}
	for _, item := range strings.Split(v, ",") {
		kv := strings.Split(item, ":")
		if len(kv) != 2 {
			return nil, fmt.Errorf("item %q is not key:value", item)
		}
		if kv[0] == "" || kv[1] == "" {
			continue
		}
		if !labelName.MatchString(kv[0]) || strings.HasPrefix(kv[0], "__") {
			return nil, fmt.Errorf("%q is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)", kv[0])
		}
		if slices.Contains(reservedTagNames, kv[0]) {
			return nil, fmt.Errorf("%q is a label of the series already (%s are taken)", kv[0], strings.Join(reservedTagNames, ", "))
		}
		byName[kv[0]] = kv[1]
	}
	tags := make([]tag, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		tags = append(tags, tag{name, byName[name]})
	}
	return tags, nil
}

// labelName is the syntax of a Prometheus label name.
var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// The reference's local cache is a freecache of LOCAL_CACHE_SIZE_IN_BYTES
// bytes, which freecache raises to 512 KiB at least. rls's denial cache is
// bounded in entries: the same memory holds size / denyCacheEntryBytes of
// them. One entry takes about 160 bytes and its key (a descriptor key with
// hashed long values: 60 to 120 bytes for Envoy Gateway's route names):
// measured with runtime.MemStats over 200000 entries, Go 1.26, amd64: 160
// bytes plus the key's length.
const (
	freecacheMinBytes   = 512 << 10
	denyCacheEntryBytes = 256
)

// denyCacheEntries is the denial cache's bound in entries for
// LOCAL_CACHE_SIZE_IN_BYTES of n > 0 bytes.
func denyCacheEntries(n int) int {
	return max(n, freecacheMinBytes) / denyCacheEntryBytes
}

// denyCacheSizeOf is the denial cache's bound in entries that c sets; 0
// (the store's default) outside compatibility mode.
func (c *compatOptions) denyCacheSizeOf() int {
	if c == nil {
		return 0
	}
	return c.denyCacheSize
}

// compatLimiter reads the settings of decisions and answers.
func compatLimiter(e *compatEnv, o *options) {
	if b := strings.ToLower(e.str("BACKEND_TYPE", "redis")); b != "redis" {
		e.refuse("BACKEND_TYPE", "rls stores counters in Redis (or in process); the memcache backend is not supported")
	}
	// Denied hits count, as in the reference, unless the operator asked
	// for the reference's partial stop: then rls's own rule, under which a
	// denied request consumes nothing at all.
	o.countDeniedHits = !e.boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)
	// The local cache: on above 0 bytes, holding what that memory holds.
	if n := e.integer("LOCAL_CACHE_SIZE_IN_BYTES", 0); n > 0 {
		o.denyCache, o.compat.denyCacheSize = true, denyCacheEntries(n)
	} else {
		o.denyCache = false
	}
	r := &o.reference
	r.answers.Shadow = e.boolean("SHADOW_MODE", false)
	r.quotaAll = e.boolean("QUOTA_MODE", false)
	r.answers.DynamicMetadata = e.boolean("RESPONSE_DYNAMIC_METADATA", false)
	if e.boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
		d := compat.DefaultLimitHeaderNames
		r.answers.LimitHeaders = &compat.LimitHeaderNames{
			Limit:     e.str("LIMIT_LIMIT_HEADER", d.Limit),
			Remaining: e.str("LIMIT_REMAINING_HEADER", d.Remaining),
			Reset:     e.str("LIMIT_RESET_HEADER", d.Reset),
		}
	}
	ratio := e.float("NEAR_LIMIT_RATIO", 0.8)
	if ratio <= 0 || ratio > 1 {
		e.fail("NEAR_LIMIT_RATIO", strconv.FormatFloat(ratio, 'f', -1, 64), "not above 0 and at most 1")
	}
	r.stats, r.nearLimitRatio = true, ratio
	o.responseHeaders = service.HeadersOff
}

// compatRedis reads the Redis settings into the Redis store's, as the
// reference reads them (settings.go, redis/driver_impl.go): its Redis
// (REDIS_*), and with REDIS_PERSECOND=true a second one for per-second
// limits (REDIS_PERSECOND_*). Both use one TLS config, from the
// REDIS_TLS_* files, when their own TLS variable says so.
func compatRedis(e *compatEnv, o *options) {
	o.store = "redis"
	o.redisPrefix = e.str("CACHE_KEY_PREFIX", "")
	if o.redisPrefix == "" {
		o.redisPrefix = "rls:"
	}
	files := redisTarget{
		ca: e.str("REDIS_TLS_CACERT", ""), cert: e.str("REDIS_TLS_CLIENT_CERT", ""), key: e.str("REDIS_TLS_CLIENT_KEY", ""),
		skipHostname: e.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false),
	}
	t := compatRedisTarget(e, "REDIS_", "/var/run/nutcracker/ratelimit.sock", files)
	if t == nil {
		return
	}
	o.redisURL, o.redisCluster, o.redisSentinel, o.redisPoolSize = t.url, t.cluster, t.sentinel, t.poolSize
	o.redisCA, o.redisCert, o.redisKey, o.redisTLSSkipHostname = t.ca, t.cert, t.key, t.skipHostname
	if !e.boolean("REDIS_PERSECOND", false) {
		for name := range e.vars {
			if strings.HasPrefix(name, "REDIS_PERSECOND_") {
				e.used[name] = true // the reference reads them too, to no effect
			}
		}
		return
	}
	o.redisPerSecond = compatRedisTarget(e, "REDIS_PERSECOND_", "/var/run/nutcracker/ratelimitpersecond.sock", files)
}

// compatRedisTarget reads the variables of one Redis, named prefix +
// SOCKET_TYPE, TYPE, URL, AUTH, SENTINEL_AUTH, TLS and POOL_SIZE, with the
// reference's defaults; with TLS, files gives its CA, client certificate
// and host name check. It returns nil after a bad value (e.err says which).
// A cluster and Sentinel are reached over TCP whatever the socket type, as
// the reference's client (radix) reaches them.
func compatRedisTarget(e *compatEnv, prefix, defaultURL string, files redisTarget) *redisTarget {
	socket := strings.ToLower(e.str(prefix+"SOCKET_TYPE", "unix"))
	typ := strings.ToLower(e.str(prefix+"TYPE", "single"))
	addr := e.str(prefix+"URL", defaultURL)
	auth := e.str(prefix+"AUTH", "")
	sentinelAuth := e.str(prefix+"SENTINEL_AUTH", "")
	useTLS := e.boolean(prefix+"TLS", false)
	t := &redisTarget{}
	if n := e.integer(prefix+"POOL_SIZE", 10); n > 0 {
		t.poolSize = n
	}
	u := &url.URL{Scheme: "redis", Path: "/0"}
	if useTLS { // without it the reference reads none of the files
		u.Scheme = "rediss"
		t.ca, t.cert, t.key, t.skipHostname = files.ca, files.cert, files.key, files.skipHostname
	}
	if user, pass, ok := strings.Cut(auth, ":"); ok {
		u.User = url.UserPassword(user, pass)
	} else if auth != "" {
		u.User = url.UserPassword("", auth)
	}
	switch typ {
	case "single":
		switch socket {
		case "tcp":
			u.Host = addr
		case "unix":
			if useTLS {
				e.fail(prefix+"TLS", "true", "TLS over a unix socket is not supported")
				return nil
			}
			u.Scheme, u.Path = "unix", addr
		default:
			e.fail(prefix+"SOCKET_TYPE", socket, "not tcp or unix")
			return nil
		}
	case "cluster":
		if t.cluster = splitList(addr); len(t.cluster) == 0 {
			e.fail(prefix+"URL", addr, "not h:p,h:p,... (the seeds of a cluster)")
			return nil
		}
		u.Host = t.cluster[0] // ignored: the URL gives credentials and TLS
	case "sentinel":
		sen, err := parseSentinel(addr)
		if err != nil {
			e.fail(prefix+"URL", addr, "not master,host:port,... (a master's name and its sentinels)")
			return nil
		}
		if user, pass, ok := strings.Cut(sentinelAuth, ":"); ok {
			sen.Username, sen.Password = user, pass
		} else {
			sen.Password = sentinelAuth
		}
		t.sentinel = sen
		u.Host = sen.Addrs[0] // ignored: the URL gives the master's credentials and TLS
	default:
		e.fail(prefix+"TYPE", typ, "not single, sentinel or cluster")
		return nil
	}
	t.url = u.String()
	return t
}

// initialConfig is the config a server starts with: the files of --config
// (rls's own rules, or the reference's in compatibility mode); in
// compatibility mode with an xDS source, an empty config when
// FORCE_START_WITHOUT_INITIAL_CONFIG says to start without one, else nil
// (not ready until the server sends one); with files, an empty config when
// the directory does not exist, as the reference starts with none.
func initialConfig(o *options, log *slog.Logger) (*config.Config, error) {
	c := o.compat
	if c != nil && c.xds != nil {
		if c.forceStart {
			return config.LoadWith(o.configLimits)
		}
		return nil, nil
	}
	if c != nil {
		if _, err := os.Stat(o.config); errors.Is(err, os.ErrNotExist) {
			log.Warn("no config directory: starting with no limits", "path", o.config)
			return config.LoadWith(o.configLimits)
		}
	}
	cfg, err := config.LoadWith(o.configLimits, o.config)
	if err != nil {
		return nil, fmt.Errorf("loading config %s:\n%w", o.config, err)
	}
	logWarnings(cfg, log)
	return cfg, nil
}

// logWarnings logs, in one line, the keys that a load ignored.
func logWarnings(cfg *config.Config, log *slog.Logger) {
	if ws := cfg.Warnings(); len(ws) > 0 {
		text := make([]string, len(ws))
		for i, w := range ws {
			text[i] = w.Error()
		}
		log.Warn("config keys ignored, as envoyproxy/ratelimit ignores them", "count", len(ws), "keys", strings.Join(text, "; "))
	}
}

// grpcServerTLS returns the gRPC listener's TLS config: base, and in
// compatibility mode with GRPC_CLIENT_TLS_SAN, a check that the client's
// certificate carries that name.
func (c *compatOptions) grpcServerTLS(base *tls.Config) *tls.Config {
	if c == nil || c.clientSAN == "" {
		return base
	}
	inner := base.GetConfigForClient
	out := base.Clone()
	san := c.clientSAN
	out.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		cfg, err := inner(h)
		if err != nil || cfg == nil {
			return cfg, err
		}
		cfg = cfg.Clone()
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !hasSAN(cs.PeerCertificates[0], san) {
				return fmt.Errorf("client certificate does not carry the name %q (GRPC_CLIENT_TLS_SAN)", san)
			}
			return nil
		}
		return cfg, nil
	}
	return out
}

// hasSAN reports whether cert names san among its DNS names, URIs, IP
// addresses or e-mail addresses.
func hasSAN(cert *x509.Certificate, san string) bool {
	if slices.Contains(cert.DNSNames, san) || slices.Contains(cert.EmailAddresses, san) {
		return true
	}
	for _, u := range cert.URIs {
		if u.String() == san {
			return true
		}
	}
	for _, ip := range cert.IPAddresses {
		if ip.String() == san {
			return true
		}
	}
	return false
}
