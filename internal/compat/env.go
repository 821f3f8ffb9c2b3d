package compat

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/tlsfiles"
	"github.com/rlsproject/rls/internal/tracing"
	"github.com/rlsproject/rls/internal/xdsconfig"
)

// settings are envoyproxy/ratelimit's environment as rls reads it, one
// field per variable as in the reference's settings.go, and what the table's
// checks derive from several of them. readEnv fills a zero value; the
// table's rows write into it, then it is only read.
type settings struct {
	// Listeners and logging.
	host, port, grpcHost, grpcPort, debugHost, debugPort string
	grpcMaxConnectionAge, grpcMaxConnectionAgeGrace      time.Duration
	logLevel                                             slog.Level
	logFormat                                            string

	// gRPC TLS.
	grpcServerUseTLS                                                    bool
	grpcServerTLSCert, grpcServerTLSKey, grpcClientTLSCACert, clientSAN string

	// Config source.
	forceStart                                            bool
	runtimeRoot, runtimeSubdirectory, runtimeAppDirectory string
	configType                                            string
	xds                                                   xdsconfig.Options // under GRPC_XDS_SOTW (TLS built by a check)
	xdsUseTLS                                             bool
	xdsTLS                                                tlsfiles.ClientFiles
	mergeDomainConfig                                     bool

	// Stats.
	disableStats                           bool
	usePrometheus, useStatsd, useDogStatsd bool
	promAddr, promPath                     string
	extraTags                              []tag // sorted by name
	statsdHost, statsdProtocol             string
	statsdPort                             int
	flushInterval                          time.Duration
	mogrifiers                             []mogrifier
	ddTags                                 []string       // DogStatsD's client's tags (DD_ENV and the like)
	statsd                                 *statsdOptions // the StatsD sink; nil: off (built by a check)

	// Decisions and answers.
	stopCacheKeyIncrement bool
	localCacheSize        int
	shadowMode, quotaMode bool
	dynamicMetadata       bool
	limitHeaders          bool
	limitHeaderNames      LimitHeaderNames
	nearLimitRatio        float64

	// Tracing.
	tracingOn    bool
	tracing      tracing.Config // endpoint, protocol, service; TLS and sampler built by a check
	samplingRate float64
	// otlpInsecure is OTEL_EXPORTER_OTLP_TRACES_INSECURE, else
	// OTEL_EXPORTER_OTLP_INSECURE; otlpInsecureName its name.
	otlpInsecure, otlpInsecureName string

	// Redis.
	cacheKeyPrefix           string
	redisTLSFiles            redisTLSFiles
	redis, redisPerSecond    redisSettings
	redisPerSecondOn         bool
	redisOpts, perSecondOpts *redisstore.Options // built by the checks

	// ignored are the variables set that rls reads and does not use, each
	// as "NAME: why", sorted; they are logged once at start.
	ignored []string

	// vars are the variables set (readEnv's); alsoRead the ones a row read
	// besides its own (a mogrifier's).
	vars     map[string]string
	alsoRead []string
}

// redisTLSFiles are the REDIS_TLS_* files, which both Redis use when their
// own TLS variable says so.
type redisTLSFiles struct {
	ca, cert, key string
	skipHostname  bool
}

// redisSettings are the variables of one Redis (REDIS_ or
// REDIS_PERSECOND_ + SOCKET_TYPE, TYPE, URL, AUTH, SENTINEL_AUTH, TLS,
// POOL_SIZE).
type redisSettings struct {
	socketType, typ, url, auth, sentinelAuth string
	tls                                      bool
	poolSize                                 int
}

// row is one line of the environment table: a variable of the reference
// (its name, its default there, and how rls reads it, or why rls does not
// use it or refuses it), or a check of the variables read before it.
type row struct {
	// name is the variable's; a trailing '*' stands for every variable of
	// that prefix (in rows that say why rls ignores them). No name: a
	// check.
	name string
	// def is the reference's default, which an unset variable takes.
	def string
	// when, if set, says whether the row applies: the variable is read,
	// the check made, the ignored variable logged only when it says so.
	when func() bool
	// read stores the value in the settings; an error (badValue) says
	// what is wrong with it.
	read func(v string) error
	// ignored: why rls does not use the variable. A set variable that no
	// applying row reads is logged once at start with it.
	ignored string
	// refused: why the variable, set (even empty), stops the start.
	refused string
	// check checks what the rows before it read; its error names the
	// variable to blame.
	check func() error
}

// envError is a variable whose value rls cannot take: the start stops with
// it (`NAME="value": why`).
type envError struct{ name, value, why string }

func (e *envError) Error() string { return fmt.Sprintf("%s=%q: %s", e.name, e.value, e.why) }

// badValue is what a row's read returns for a value it cannot take: the
// value as the message shows it (case-folded as it was read), and why.
type badValue struct{ value, why string }

func (e *badValue) Error() string { return e.why }

// table is envoyproxy/ratelimit's environment (reference §1.6), in the
// order rls reads it: the first variable it cannot take stops the read.
// Rows read into s.
func (s *settings) table() []row {
	grpcTLS := func() bool { return s.grpcServerUseTLS }
	xds := func() bool { return s.configType == "GRPC_XDS_SOTW" }
	xdsTLS := func() bool { return xds() && s.xdsUseTLS }
	statsOn := func() bool { return !s.disableStats }
	prom := func() bool { return statsOn() && s.usePrometheus }
	statsd := func() bool { return statsOn() && (s.useStatsd || s.useDogStatsd) }
	plainStatsd := func() bool { return statsOn() && s.useStatsd }
	dog := func() bool { return statsOn() && s.useDogStatsd }
	tagged := func() bool { return prom() || statsd() }
	headers := func() bool { return s.limitHeaders }
	perSecond := func() bool { return s.redisPerSecondOn }
	tracingOn := func() bool { return s.tracingOn }
	tracingOff := func() bool { return !s.tracingOn }
	const noTracing = "TRACING_ENABLED is not true: no spans are exported"
	const statsOff = "DISABLE_STATS is true: no stats sink is on"
	const noStatsd = "no StatsD sink is on (USE_STATSD, USE_DOG_STATSD), or DISABLE_STATS is true"
	rows := []row{
		// Listeners and logging.
		{name: "HOST", def: "0.0.0.0", read: text(&s.host)},
		{name: "PORT", def: "8080", read: text(&s.port)},
		{name: "GRPC_HOST", def: "0.0.0.0", read: text(&s.grpcHost)},
		{name: "GRPC_PORT", def: "8081", read: text(&s.grpcPort)},
		{name: "DEBUG_HOST", def: "0.0.0.0", read: text(&s.debugHost)},
		{name: "DEBUG_PORT", def: "6070", read: text(&s.debugPort)},
		{name: "GRPC_UDS", refused: "rls serves gRPC on TCP only; use GRPC_HOST and GRPC_PORT"},
		{name: "GRPC_MAX_CONNECTION_AGE", def: grpcserver.DefaultMaxConnectionAge.String(), read: positive(&s.grpcMaxConnectionAge)},
		{name: "GRPC_MAX_CONNECTION_AGE_GRACE", def: grpcserver.DefaultMaxConnectionAgeGrace.String(), read: positive(&s.grpcMaxConnectionAgeGrace)},
		{name: "LOG_LEVEL", def: "WARN", read: s.readLogLevel},
		{name: "LOG_FORMAT", def: "text", read: oneOf(&s.logFormat, strings.ToLower, "not text or json", "text", "json")},

		// gRPC TLS: client certificates required only with
		// GRPC_CLIENT_TLS_CACERT (and then carrying GRPC_CLIENT_TLS_SAN
		// when set).
		{name: "GRPC_SERVER_USE_TLS", def: "false", read: flag(&s.grpcServerUseTLS)},
		{name: "GRPC_SERVER_TLS_CERT", when: grpcTLS, read: text(&s.grpcServerTLSCert)},
		{name: "GRPC_SERVER_TLS_KEY", when: grpcTLS, read: text(&s.grpcServerTLSKey)},
		{when: grpcTLS, check: func() error {
			if s.grpcServerTLSCert == "" || s.grpcServerTLSKey == "" {
				return &envError{"GRPC_SERVER_USE_TLS", "true", "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"}
			}
			return nil
		}},
		{name: "GRPC_CLIENT_TLS_CACERT", when: grpcTLS, read: text(&s.grpcClientTLSCACert)},
		{name: "GRPC_CLIENT_TLS_SAN", when: grpcTLS, read: text(&s.clientSAN)},
		{when: grpcTLS, check: func() error {
			if s.clientSAN != "" && s.grpcClientTLSCACert == "" {
				return &envError{"GRPC_CLIENT_TLS_SAN", s.clientSAN, "needs GRPC_CLIENT_TLS_CACERT (client certificates are required only with it)"}
			}
			return nil
		}},
		{name: "GRPC_SERVER_TLS_CA_CERT", ignored: "client certificates are required only with GRPC_CLIENT_TLS_CACERT, as in envoyproxy/ratelimit"},
		{name: "GRPC_SERVER_TLS_CERT_RELOAD*", ignored: "the certificate files are re-read when they change"},

		// Config source: files under RUNTIME_ROOT (CONFIG_TYPE=FILE) or an
		// xDS server (GRPC_XDS_SOTW).
		{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", def: "false", read: flag(&s.forceStart)},
		{name: "RUNTIME_ROOT", def: "/srv/runtime_data/current", read: text(&s.runtimeRoot)},
		{name: "RUNTIME_SUBDIRECTORY", read: text(&s.runtimeSubdirectory)},
		{name: "RUNTIME_APPDIRECTORY", def: "config", read: text(&s.runtimeAppDirectory)},
		{name: "RUNTIME_IGNOREDOTFILES", def: "false", ignored: "rls always skips files and directories whose names start with a dot"},
		{name: "RUNTIME_WATCH_ROOT", def: "true", ignored: "rls watches the config directory and the directories above it, so both a symlink swap and a file change reload"},
		{name: "CONFIG_TYPE", def: "FILE", read: oneOf(&s.configType, strings.ToUpper, "not FILE or GRPC_XDS_SOTW", "FILE", "GRPC_XDS_SOTW")},
		{name: "CONFIG_GRPC_XDS_SERVER_URL", def: "localhost:18000", when: xds, read: text(&s.xds.Server)},
		{name: "CONFIG_GRPC_XDS_NODE_ID", def: "default", when: xds, read: text(&s.xds.NodeID)},
		{name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", def: xdsconfig.DefaultBackoff.Initial.String(), when: xds, read: positive(&s.xds.Backoff.Initial)},
		{name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", def: xdsconfig.DefaultBackoff.Max.String(), when: xds, read: positive(&s.xds.Backoff.Max)},
		{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", def: formatFloat(xdsconfig.DefaultBackoff.RandomFactor), when: xds, read: number(&s.xds.Backoff.RandomFactor)},
		{name: "XDS_CLIENT_BACKOFF_JITTER", def: strconv.FormatBool(xdsconfig.DefaultBackoff.Jitter), when: xds, read: flag(&s.xds.Backoff.Jitter)},
		{name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", def: "0", when: xds, read: whole(&s.xds.MaxMsgSize)},
		{name: "CONFIG_GRPC_XDS_NODE_METADATA", when: xds, read: s.readNodeMetadata},
		{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", when: xds, read: s.readXDSHeaders},
		{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", def: "false", when: xds, read: flag(&s.xdsUseTLS)},
		{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", when: xdsTLS, read: text(&s.xdsTLS.CA)},
		{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", when: xdsTLS, read: text(&s.xdsTLS.Cert)},
		{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", when: xdsTLS, read: text(&s.xdsTLS.Key)},
		{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", when: xdsTLS, read: text(&s.xdsTLS.ServerName)},
		{when: xdsTLS, check: func() (err error) {
			if s.xds.TLS, err = tlsfiles.Client(s.xdsTLS); err != nil {
				return &envError{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", err.Error()}
			}
			return nil
		}},
		{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", def: "3s", ignored: "reconnections follow XDS_CLIENT_BACKOFF_*"},

		// Stats: the reference's per-limit stats always (on the HTTP port's
		// /metrics), and unless DISABLE_STATS one of its sinks: USE_PROMETHEUS
		// on a listener of its own, USE_STATSD (the default) or
		// USE_DOG_STATSD sent every STATS_FLUSH_INTERVAL.
		{name: "DISABLE_STATS", def: "false", read: flag(&s.disableStats)},
		{name: "USE_PROMETHEUS", def: "false", when: statsOn, read: flag(&s.usePrometheus)},
		{name: "USE_STATSD", def: "true", when: statsOn, read: flag(&s.useStatsd)},
		{name: "USE_DOG_STATSD", def: "false", when: statsOn, read: flag(&s.useDogStatsd)},
		{when: statsOn, check: s.oneSink},
		{name: "PROMETHEUS_ADDR", def: ":9090", when: prom, read: text(&s.promAddr)},
		{name: "PROMETHEUS_PATH", def: "/metrics", when: prom, read: func(v string) error {
			if !strings.HasPrefix(v, "/") {
				return &badValue{v, "not a path starting with /"}
			}
			s.promPath = v
			return nil
		}},
		{name: "STATSD_HOST", def: "localhost", when: statsd, read: text(&s.statsdHost)},
		{name: "STATSD_PORT", def: "8125", when: statsd, read: func(v string) (err error) {
			if s.statsdPort, err = strconv.Atoi(v); err != nil || s.statsdPort < 1 || s.statsdPort > 65535 {
				return &badValue{v, "not a port number"}
			}
			return nil
		}},
		// Read by the reference's StatsD library itself (gostats).
		{name: "STATSD_PROTOCOL", def: "tcp", when: plainStatsd, read: oneOf(&s.statsdProtocol, strings.ToLower, "not tcp or udp", "tcp", "udp")},
		{name: "STATS_FLUSH_INTERVAL", def: "10s", when: statsd, read: positive(&s.flushInterval)},
		{name: "USE_DOG_STATSD_MOGRIFIERS", when: dog, read: s.readMogrifiers},
		// Read by the reference's DogStatsD client (datadog-go) itself:
		// tags on every line.
		{name: "DD_ENTITY_ID", when: dog, read: s.ddTag("dd.internal.entity_id")},
		{name: "DD_ENV", when: dog, read: s.ddTag("env")},
		{name: "DD_SERVICE", when: dog, read: s.ddTag("service")},
		{name: "DD_VERSION", when: dog, read: s.ddTag("version")},
		{name: "EXTRA_TAGS", when: tagged, read: func(v string) (err error) {
			if s.extraTags, err = parseExtraTags(v, s.usePrometheus); err != nil {
				return &badValue{v, err.Error()}
			}
			return nil
		}},
		{when: statsd, check: s.statsdConfig},
		{name: "USE_PROMETHEUS", ignored: statsOff},
		{name: "USE_STATSD", ignored: statsOff},
		{name: "USE_DOG_STATSD", ignored: statsOff},
		{name: "EXTRA_TAGS", ignored: "no stats sink is on (USE_PROMETHEUS, USE_STATSD, USE_DOG_STATSD), or DISABLE_STATS is true"},
		{name: "STATSD_PROTOCOL", when: dog, ignored: "DogStatsD is sent over UDP, as the reference's client sends it"},
		{name: "STATSD_*", ignored: noStatsd},
		{name: "STATS_FLUSH_INTERVAL", ignored: noStatsd},
		{name: "DOG_STATSD_MOGRIFIER_*", when: dog, ignored: "not a mogrifier that USE_DOG_STATSD_MOGRIFIERS lists"},
		{name: "USE_DOG_STATSD_MOGRIFIERS", ignored: "USE_DOG_STATSD is not on"},
		{name: "DOG_STATSD_*", ignored: "USE_DOG_STATSD is not on"},
		{name: "PROMETHEUS_MAPPER_YAML", ignored: "the reference's stats carry the default mapping's names and labels"},
		{name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", ignored: "rls's latency histograms are in seconds"},

		// Decisions and answers.
		{name: "BACKEND_TYPE", def: "redis", read: func(v string) error {
			if strings.ToLower(v) != "redis" {
				return &badValue{v, "rls stores counters in Redis (or in process); the memcache backend is not supported"}
			}
			return nil
		}},
		{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", def: "false", read: flag(&s.stopCacheKeyIncrement)},
		{name: "LOCAL_CACHE_SIZE_IN_BYTES", def: "0", read: whole(&s.localCacheSize)},
		{name: "SHADOW_MODE", def: "false", read: flag(&s.shadowMode)},
		{name: "QUOTA_MODE", def: "false", read: flag(&s.quotaMode)},
		{name: "RESPONSE_DYNAMIC_METADATA", def: "false", read: flag(&s.dynamicMetadata)},
		{name: "LIMIT_RESPONSE_HEADERS_ENABLED", def: "false", read: flag(&s.limitHeaders)},
		{name: "LIMIT_LIMIT_HEADER", def: DefaultLimitHeaderNames.Limit, when: headers, read: text(&s.limitHeaderNames.Limit)},
		{name: "LIMIT_REMAINING_HEADER", def: DefaultLimitHeaderNames.Remaining, when: headers, read: text(&s.limitHeaderNames.Remaining)},
		{name: "LIMIT_RESET_HEADER", def: DefaultLimitHeaderNames.Reset, when: headers, read: text(&s.limitHeaderNames.Reset)},
		{name: "NEAR_LIMIT_RATIO", def: "0.8", read: func(v string) error {
			if err := number(&s.nearLimitRatio)(v); err != nil {
				return err
			}
			if s.nearLimitRatio <= 0 || s.nearLimitRatio > 1 {
				return &badValue{formatFloat(s.nearLimitRatio), "not above 0 and at most 1"}
			}
			return nil
		}},
		{name: "EXPIRATION_JITTER_MAX_SECONDS", def: "300", ignored: "rls sets each key's expiry once, when it is created, to when its state stops meaning anything"},
		{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", def: "false", ignored: "/healthcheck answers 200 once a config is loaded, or at once with FORCE_START_WITHOUT_INITIAL_CONFIG"},
		{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", def: "false", ignored: "/readyz and gRPC health follow Redis; /healthcheck does not, as in the reference"},

		// Redis (redis/driver_impl.go): its Redis, and with
		// REDIS_PERSECOND=true a second one for per-second limits. Both
		// use the REDIS_TLS_* files when their own TLS variable says so.
		{name: "CACHE_KEY_PREFIX", read: text(&s.cacheKeyPrefix)},
		{name: "REDIS_TLS_CACERT", read: text(&s.redisTLSFiles.ca)},
		{name: "REDIS_TLS_CLIENT_CERT", read: text(&s.redisTLSFiles.cert)},
		{name: "REDIS_TLS_CLIENT_KEY", read: text(&s.redisTLSFiles.key)},
		{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", read: flag(&s.redisTLSFiles.skipHostname)},
	}
	rows = append(rows, s.redisRows("REDIS_", "/var/run/nutcracker/ratelimit.sock", &s.redis, &s.redisOpts, nil)...)
	rows = append(rows, row{name: "REDIS_PERSECOND", def: "false", read: flag(&s.redisPerSecondOn)})
	rows = append(rows, s.redisRows("REDIS_PERSECOND_", "/var/run/nutcracker/ratelimitpersecond.sock", &s.redisPerSecond, &s.perSecondOpts, perSecond)...)
	return append(rows, []row{
		{name: "REDIS_TIMEOUT", def: "10s", ignored: "a dial timeout there; rls bounds each decision by its store timeout (10ms) instead"},
		{name: "REDIS_PIPELINE_WINDOW", ignored: "rls pipelines concurrent requests by itself"},
		{name: "REDIS_PIPELINE_LIMIT", ignored: "rls pipelines concurrent requests by itself"},
		{name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", ignored: "rls calls the masters of a request concurrently"},
		{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", ignored: "requests wait for a connection"},
		{name: "REDIS_STARTUP_*", ignored: "rls starts without waiting for Redis and reconnects by itself; /readyz says when Redis answers"},
		// Without REDIS_PERSECOND the reference reads them too, to no
		// effect: they are not logged.
		{name: "REDIS_PERSECOND_*", when: perSecond, ignored: "ignored as its REDIS_ twin is (store timeout, pipelining, pool)"},
		{name: "MEMCACHE_*", ignored: "the memcache backend is not supported"},

		// Tracing (src/trace/trace.go): OTLP over HTTP unless
		// TRACING_EXPORTER_PROTOCOL says grpc, to the OTEL_EXPORTER_OTLP_
		// endpoint or the exporter's default (localhost, TLS); the
		// exporter reads its other OTEL_EXPORTER_OTLP_* variables itself.
		{name: "TRACING_ENABLED", def: "false", read: flag(&s.tracingOn)},
		{name: "TRACING_EXPORTER_PROTOCOL", def: "http", when: tracingOn, read: func(v string) (err error) {
			if s.tracing.Protocol, err = tracing.ParseProtocol(v); err != nil {
				return &badValue{v, "not http or grpc"}
			}
			return nil
		}},
		{name: "TRACING_SERVICE_NAME", def: "RateLimit", when: tracingOn, read: text(&s.tracing.ServiceName)},
		{name: "TRACING_SERVICE_NAMESPACE", when: tracingOn, read: text(&s.tracing.ServiceNamespace)},
		{name: "TRACING_SERVICE_INSTANCE_ID", when: tracingOn, read: text(&s.tracing.ServiceInstanceID)},
		{name: "TRACING_SAMPLING_RATE", def: "1", when: tracingOn, read: number(&s.samplingRate)},
		{name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", when: tracingOn, read: text(&s.tracing.Endpoint)},
		{name: "OTEL_EXPORTER_OTLP_ENDPOINT", when: tracingOn, read: text(&s.tracing.BaseEndpoint)},
		{name: "OTEL_EXPORTER_OTLP_INSECURE", when: tracingOn, read: s.readInsecure("OTEL_EXPORTER_OTLP_INSECURE")},
		{name: "OTEL_EXPORTER_OTLP_TRACES_INSECURE", when: tracingOn, read: s.readInsecure("OTEL_EXPORTER_OTLP_TRACES_INSECURE")},
		{when: tracingOn, check: s.tracingConfig},
		{name: "TRACING_*", when: tracingOff, ignored: noTracing},
		{name: "OTEL_*", when: tracingOff, ignored: noTracing},

		// Read last, once everything else is known to be good.
		{name: "MERGE_DOMAIN_CONFIG", def: "false", read: flag(&s.mergeDomainConfig)},
	}...)
}

// tracingConfig completes the tracing settings that the rows read: the
// exporter's default endpoint when no variable names one, TLS unless an
// OTEL_EXPORTER_OTLP_*INSECURE variable says true (the exporter's
// defaults), the sampler of TRACING_SAMPLING_RATE (a share of trace ids,
// whatever the caller decided, as the reference samples), and a random
// service.instance.id when TRACING_SERVICE_INSTANCE_ID is unset.
func (s *settings) tracingConfig() error {
	t := &s.tracing
	if !t.On() {
		t.Endpoint = "localhost:4317"
		if t.Protocol == tracing.HTTP {
			t.Endpoint = "localhost:4318"
		}
	}
	t.TLS = tracing.TLSOn
	if s.otlpInsecure != "" {
		insecure, err := strconv.ParseBool(s.otlpInsecure)
		if err != nil {
			return &envError{s.otlpInsecureName, s.otlpInsecure, "not true or false"}
		}
		if insecure {
			t.TLS = tracing.TLSOff
		}
	}
	if err := t.Check(); err != nil {
		name, v := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", t.Endpoint
		if v == "" {
			name, v = "OTEL_EXPORTER_OTLP_ENDPOINT", t.BaseEndpoint
		}
		return &envError{name, v, "not host:port or an http:// or https:// URL"}
	}
	t.Sampler = sdktrace.TraceIDRatioBased(s.samplingRate)
	if t.ServiceInstanceID == "" {
		t.ServiceInstanceID = randomUUID()
	}
	return nil
}

// readInsecure reads the variable name, one of OTEL_EXPORTER_OTLP_INSECURE
// and its TRACES_ twin (read after it, so that it wins when set).
func (s *settings) readInsecure(name string) func(string) error {
	return func(v string) error {
		if v != "" {
			s.otlpInsecure, s.otlpInsecureName = v, name
		}
		return nil
	}
}

// randomUUID returns a random (version 4) UUID, as the reference names an
// instance that TRACING_SERVICE_INSTANCE_ID does not.
func randomUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// redisRows are the rows of one Redis: the variables prefix + SOCKET_TYPE,
// TYPE, URL, AUTH, SENTINEL_AUTH, TLS and POOL_SIZE with the reference's
// defaults, read into r when when says so (nil: always), and the check that
// builds the store's options of them into *opts.
func (s *settings) redisRows(prefix, defaultURL string, r *redisSettings, opts **redisstore.Options, when func() bool) []row {
	return []row{
		{name: prefix + "SOCKET_TYPE", def: "unix", when: when, read: folded(&r.socketType, strings.ToLower)},
		{name: prefix + "TYPE", def: "single", when: when, read: folded(&r.typ, strings.ToLower)},
		{name: prefix + "URL", def: defaultURL, when: when, read: text(&r.url)},
		{name: prefix + "AUTH", when: when, read: text(&r.auth)},
		{name: prefix + "SENTINEL_AUTH", when: when, read: text(&r.sentinelAuth)},
		{name: prefix + "TLS", def: "false", when: when, read: flag(&r.tls)},
		{name: prefix + "POOL_SIZE", def: "10", when: when, read: whole(&r.poolSize)},
		{when: when, check: func() (err error) {
			*opts, err = s.redisOptions(prefix, r)
			return err
		}},
	}
}

// redisOptions builds the options of one Redis, as the reference reaches
// it (settings.go, redis/driver_impl.go): with TLS, the REDIS_TLS_* files
// give its CA, client certificate and host name check. A cluster and
// Sentinel are reached over TCP whatever the socket type, as the
// reference's client (radix) reaches them.
func (s *settings) redisOptions(prefix string, r *redisSettings) (*redisstore.Options, error) {
	o := &redisstore.Options{}
	if r.poolSize > 0 {
		o.PoolSize = r.poolSize
	}
	u := &url.URL{Scheme: "redis", Path: "/0"}
	if r.tls { // without it the reference reads none of the files
		u.Scheme = "rediss"
		f := s.redisTLSFiles
		o.CAFile, o.CertFile, o.KeyFile, o.TLSSkipHostname = f.ca, f.cert, f.key, f.skipHostname
	}
	if user, pass, ok := strings.Cut(r.auth, ":"); ok {
		u.User = url.UserPassword(user, pass)
	} else if r.auth != "" {
		u.User = url.UserPassword("", r.auth)
	}
	switch r.typ {
	case "single":
		switch r.socketType {
		case "tcp":
			u.Host = r.url
		case "unix":
			if r.tls {
				return nil, &envError{prefix + "TLS", "true", "TLS over a unix socket is not supported"}
			}
			u.Scheme, u.Path = "unix", r.url
		default:
			return nil, &envError{prefix + "SOCKET_TYPE", r.socketType, "not tcp or unix"}
		}
	case "cluster":
		if o.ClusterSeeds = daemon.SplitList(r.url); len(o.ClusterSeeds) == 0 {
			return nil, &envError{prefix + "URL", r.url, "not h:p,h:p,... (the seeds of a cluster)"}
		}
		u.Host = o.ClusterSeeds[0] // ignored: the URL gives credentials and TLS
	case "sentinel":
		sen, err := daemon.ParseSentinel(r.url)
		if err != nil {
			return nil, &envError{prefix + "URL", r.url, "not master,host:port,... (a master's name and its sentinels)"}
		}
		if user, pass, ok := strings.Cut(r.sentinelAuth, ":"); ok {
			sen.Username, sen.Password = user, pass
		} else {
			sen.Password = r.sentinelAuth
		}
		o.Sentinel = sen
		u.Host = sen.Addrs[0] // ignored: the URL gives the master's credentials and TLS
	default:
		return nil, &envError{prefix + "TYPE", r.typ, "not single, sentinel or cluster"}
	}
	o.URL = u.String()
	return o, nil
}

// readLogLevel reads LOG_LEVEL: logrus's names, in any case.
func (s *settings) readLogLevel(v string) error {
	switch v = strings.ToLower(v); v {
	case "trace", "debug":
		s.logLevel = slog.LevelDebug
	case "info":
		s.logLevel = slog.LevelInfo
	case "warn", "warning":
		s.logLevel = slog.LevelWarn
	case "error", "fatal", "panic":
		s.logLevel = slog.LevelError
	default:
		return &badValue{v, "not one of trace|debug|info|warn|error|fatal|panic"}
	}
	return nil
}

// readNodeMetadata reads CONFIG_GRPC_XDS_NODE_METADATA as the reference
// reads it: k1=v1,k2=v2, string values, split at the first '=', an item
// without one skipped.
func (s *settings) readNodeMetadata(v string) error {
	s.xds.NodeMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, kv := range strings.Split(v, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			s.xds.NodeMetadata.Fields[k] = structpb.NewStringValue(v)
		}
	}
	return nil
}

// readXDSHeaders reads CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS:
// k1:v1,k2:v2, names lower-cased.
func (s *settings) readXDSHeaders(v string) error {
	if v == "" {
		return nil
	}
	s.xds.Headers = map[string]string{}
	for _, kv := range daemon.SplitList(v) {
		k, val, ok := strings.Cut(kv, ":")
		if !ok {
			return &badValue{v, "not k1:v1,k2:v2"}
		}
		s.xds.Headers[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(val)
	}
	return nil
}

// oneSink checks that one stats sink at most is on, as the reference
// refuses to start with two. USE_STATSD is true by default there, so that
// the reference starts with USE_PROMETHEUS or USE_DOG_STATSD only when
// USE_STATSD=false is set too; rls lets an unset USE_STATSD give way to
// the other sink instead (no working deployment of the reference has that
// environment, and rls's compatibility mode took it before it had a StatsD
// sink).
func (s *settings) oneSink() error {
	_, statsdSet := s.vars["USE_STATSD"]
	statsdSet = statsdSet && s.useStatsd
	const why = "only one stats sink may be on, and %s is true too: set one of USE_DOG_STATSD, USE_STATSD, USE_PROMETHEUS"
	switch {
	case s.useDogStatsd && s.usePrometheus:
		return &envError{"USE_DOG_STATSD", s.vars["USE_DOG_STATSD"], fmt.Sprintf(why, "USE_PROMETHEUS")}
	case s.useDogStatsd && statsdSet:
		return &envError{"USE_DOG_STATSD", s.vars["USE_DOG_STATSD"], fmt.Sprintf(why, "USE_STATSD")}
	case s.usePrometheus && statsdSet:
		return &envError{"USE_PROMETHEUS", s.vars["USE_PROMETHEUS"], fmt.Sprintf(why, "USE_STATSD")}
	}
	if s.useDogStatsd || s.usePrometheus {
		s.useStatsd = false
	}
	return nil
}

// readMogrifiers reads USE_DOG_STATSD_MOGRIFIERS (names, comma-separated)
// and each mogrifier's DOG_STATSD_MOGRIFIER_<NAME>_* variables.
func (s *settings) readMogrifiers(v string) error {
	if v == "" {
		return nil
	}
	for _, name := range strings.Split(v, ",") {
		if name == "" {
			return &badValue{v, "an empty mogrifier name"}
		}
		m, read, err := parseMogrifier(name, s.vars)
		if err != nil {
			return err
		}
		s.mogrifiers = append(s.mogrifiers, m)
		s.alsoRead = append(s.alsoRead, read...)
	}
	return nil
}

// ddTag reads a variable of the DogStatsD client's that puts the tag name
// with its value on every line.
func (s *settings) ddTag(name string) func(string) error {
	return func(v string) error {
		if v != "" {
			s.ddTags = append(s.ddTags, name+":"+v)
		}
		return nil
	}
}

// statsdConfig builds the StatsD sink's options from what the rows read.
func (s *settings) statsdConfig() error {
	o := &statsdOptions{
		network: s.statsdProtocol, addr: net.JoinHostPort(s.statsdHost, strconv.Itoa(s.statsdPort)),
		dog: s.useDogStatsd, tags: s.extraTags, interval: s.flushInterval,
	}
	if o.dog {
		o.network, o.globalTags, o.mogrifiers = "udp", s.ddTags, s.mogrifiers
	}
	s.statsd = o
	return nil
}

// The readers of the table's rows: each stores a value of one type, or says
// why it cannot.

func text(p *string) func(string) error {
	return func(v string) error { *p = v; return nil }
}

// folded stores v case-folded by fold (and shows it so in errors).
func folded(p *string, fold func(string) string) func(string) error {
	return func(v string) error { *p = fold(v); return nil }
}

// oneOf stores v, folded, when it is one of values.
func oneOf(p *string, fold func(string) string, why string, values ...string) func(string) error {
	return func(v string) error {
		if v = fold(v); !slices.Contains(values, v) {
			return &badValue{v, why}
		}
		*p = v
		return nil
	}
}

func flag(p *bool) func(string) error {
	return func(v string) (err error) {
		if *p, err = strconv.ParseBool(v); err != nil {
			return &badValue{v, "not true or false"}
		}
		return nil
	}
}

func whole(p *int) func(string) error {
	return func(v string) (err error) {
		if *p, err = strconv.Atoi(v); err != nil || *p < 0 {
			return &badValue{v, "not a whole number"}
		}
		return nil
	}
}

func positive(p *time.Duration) func(string) error {
	return func(v string) (err error) {
		if *p, err = time.ParseDuration(v); err != nil || *p <= 0 {
			return &badValue{v, "not a positive duration such as 10s"}
		}
		return nil
	}
}

func number(p *float64) func(string) error {
	return func(v string) (err error) {
		if *p, err = strconv.ParseFloat(v, 64); err != nil {
			return &badValue{v, "not a number"}
		}
		return nil
	}
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// readEnv reads env (NAME=value items) as envoyproxy/ratelimit reads its
// environment: a variable counts when it is set, even empty, and takes the
// reference's default otherwise. The first variable rls cannot take (a bad
// value, a refused variable, a failed check) is the error, an *envError.
func readEnv(env []string) (*settings, error) {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	s := &settings{vars: vars}
	rows := s.table()
	read := map[string]bool{}
	for _, r := range rows {
		if r.when != nil && !r.when() {
			continue
		}
		switch {
		case r.check != nil:
			if err := r.check(); err != nil {
				return nil, err
			}
		case r.refused != "":
			if v, ok := vars[r.name]; ok {
				return nil, &envError{r.name, v, r.refused}
			}
		case r.read != nil:
			v, ok := vars[r.name]
			if !ok {
				v = r.def
			}
			read[r.name] = true
			if err := r.read(v); err != nil {
				var bad *badValue
				if !errors.As(err, &bad) {
					bad = &badValue{v, err.Error()}
				}
				return nil, &envError{r.name, bad.value, bad.why}
			}
		}
	}
	for _, name := range s.alsoRead {
		read[name] = true
	}
	s.ignored = ignoredVars(vars, read, rows)
	return s, nil
}

// ignoredVars lists, sorted, the variables of vars that no row read and an
// applying row says rls ignores, each as "NAME: why".
func ignoredVars(vars map[string]string, read map[string]bool, rows []row) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(vars)) {
		if read[name] {
			continue
		}
		for _, r := range rows {
			if r.ignored == "" || (r.when != nil && !r.when()) {
				continue
			}
			prefix, wild := strings.CutSuffix(r.name, "*")
			if name == r.name || (wild && strings.HasPrefix(name, prefix)) {
				out = append(out, name+": "+r.ignored)
				break
			}
		}
	}
	return out
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
// With promNames (the tags are Prometheus labels) the names must be label
// names that the series do not have already; otherwise (StatsD tags) they
// must not hold what would break a StatsD line or tag. The result is
// sorted by name.
func parseExtraTags(v string, promNames bool) ([]tag, error) {
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
		switch {
		case !promNames:
			if strings.ContainsFunc(kv[0], func(r rune) bool { return r <= ' ' || strings.ContainsRune("|#=@", r) }) {
				return nil, fmt.Errorf("%q is not a stats tag name (no spaces, control characters, |, #, = or @)", kv[0])
			}
		case !labelName.MatchString(kv[0]) || strings.HasPrefix(kv[0], "__"):
			return nil, fmt.Errorf("%q is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)", kv[0])
		case slices.Contains(reservedTagNames, kv[0]):
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
