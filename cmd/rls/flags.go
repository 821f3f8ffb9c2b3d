package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/compat"
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tracing"
)

// usageError is a bad command line; it exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// errSilent ends the program with exit code 1 after its output said why.
var errSilent = errors.New("")

// exitError ends the program with its code; main prints err unless it is
// empty.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	var e exitError
	if errors.As(err, &e) {
		return e.code
	}
	return 1
}

// helpIsSuccess turns the flag.ErrHelp of a command's --help (its help is
// printed) into success, and returns other errors as they are.
func helpIsSuccess(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// serveFlags are the serve flags as given, before they are checked: the
// Config that takes a flag's value as it is, and the text of the others.
type serveFlags struct {
	cfg                                                              daemon.Config
	kind, cluster, onErr, headers, debug, proxies, level, mem, tlsOn string
	grpcMaxStreams                                                   uint
	configSizes                                                      configSizes
	sentinel, perSecond                                              sentinelFlags
	perSecondURL, perSecondCluster                                   string
	compatMode                                                       string // --compat: "" or envoy-ratelimit
	referenceStats                                                   bool
	otlpInsecure                                                     bool
	decisionLog                                                      decisionLogFlags
}

// decisionLogFlags are the decision log's flags that are checked, not
// taken as they are.
type decisionLogFlags struct{ hashKeyFile, maxSize string }

// sentinelFlags are the flags of one Redis behind Sentinel.
type sentinelFlags struct{ spec, user, password string }

// configSizes are the flags that bound what a config load reads, shared by
// serve and validate.
type configSizes struct{ file, total string }

func (c *configSizes) define(fs *flag.FlagSet) {
	d := config.LoadOptions{}.WithDefaults()
	fs.StringVar(&c.file, "config-max-file-bytes", formatBytes(d.MaxFileBytes), "bound on one config file (`size`, as --memory-limit); a larger one fails the load, and a reload keeps the config in use")
	fs.StringVar(&c.total, "config-max-total-bytes", formatBytes(d.MaxTotalBytes), "bound on all the config files of one load (`size`)")
}

// parse returns the load options, or the name of the bad flag and why.
func (c *configSizes) parse() (config.LoadOptions, string, error) {
	var o config.LoadOptions
	var err error
	if o.MaxFileBytes, err = parseBytes(c.file); err != nil || o.MaxFileBytes <= 0 {
		return o, "config-max-file-bytes", fmt.Errorf("%q is not a positive size", c.file)
	}
	if o.MaxTotalBytes, err = parseBytes(c.total); err != nil || o.MaxTotalBytes <= 0 {
		return o, "config-max-total-bytes", fmt.Errorf("%q is not a positive size", c.total)
	}
	return o, "", nil
}

// newServeFlagSet defines the serve flags on a new FlagSet, with the
// server's defaults (daemon.Defaults) as theirs.
func newServeFlagSet() (*flag.FlagSet, *serveFlags) {
	fs := flag.NewFlagSet("rls serve", flag.ContinueOnError)
	f := &serveFlags{cfg: daemon.Defaults()}
	c := &f.cfg
	r := &c.Store.Redis
	l := &c.Listeners
	fs.StringVar(&c.Files.Path, "config", c.Files.Path, "a YAML `path`: a file, or a directory whose *.yaml and *.yml files (subdirectories included) are all loaded")
	fs.StringVar(&l.GRPCAddr, "grpc-addr", l.GRPCAddr, "gRPC listen `address`: RateLimitService, Authorization (ext_authz), health, reflection")
	fs.StringVar(&l.HTTPAddr, "http-addr", l.HTTPAddr, "HTTP listen `address`: /healthz, /readyz, /metrics, /json, /auth/{domain}, /debug/")
	fs.StringVar(&f.kind, "store", string(c.Store.Kind), "where counters live (`kind`): memory (embedded, one process) or redis (shared by every rls on it)")
	fs.StringVar(&r.URL, "redis-url", r.URL, "Redis `URL`: redis:// or rediss:// (TLS), user and password in the URL; with --redis-cluster or --redis-sentinel, only its credentials and TLS (and database) count")
	fs.StringVar(&f.cluster, "redis-cluster", "", "comma-separated `host:port` seeds of a Redis Cluster; when set, cluster mode")
	fs.StringVar(&r.Prefix, "redis-prefix", r.Prefix, "`prefix` of every Redis key (several rls deployments can share one Redis)")
	fs.StringVar(&r.CAFile, "redis-ca", "", "PEM `file` of the CA that signs Redis's certificate (rediss:// with a private CA)")
	fs.StringVar(&r.CertFile, "redis-cert", "", "PEM `file` of a client certificate to present to Redis (rediss://, Redis's tls-auth-clients); re-read at every connection")
	fs.StringVar(&r.KeyFile, "redis-key", "", "PEM `file` of the key of --redis-cert")
	fs.IntVar(&r.PoolSize, "redis-pool-size", r.PoolSize, "Redis `connections` per node (0: 10 per CPU)")
	fs.StringVar(&f.sentinel.spec, "redis-sentinel", "", "a master watched by Redis Sentinel, as `master,host:port,...`: its name, then its sentinels' addresses; rls follows its failovers. --redis-url gives the master's credentials, database and TLS")
	fs.StringVar(&f.sentinel.user, "redis-sentinel-user", "", "ACL `user` for the sentinels of --redis-sentinel (not the master's)")
	fs.StringVar(&f.sentinel.password, "redis-sentinel-password", "", "`password` of the sentinels of --redis-sentinel (their requirepass; not the master's)")
	fs.BoolVar(&r.TLSSkipHostname, "redis-tls-skip-hostname", false, "rediss://: verify Redis's certificate chain but not that it names the host reached (Sentinel gives masters' IP addresses), as envoyproxy/ratelimit's REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	fs.StringVar(&f.perSecondURL, "redis-per-second-url", "", "Redis `URL` of a second Redis for the windows shorter than a minute (unit: second), as envoyproxy/ratelimit's REDIS_PERSECOND; decisions stay all-or-nothing across both. With --redis-per-second-cluster or --redis-per-second-sentinel, its credentials and TLS (default: --redis-url's)")
	fs.StringVar(&f.perSecondCluster, "redis-per-second-cluster", "", "comma-separated `host:port` seeds of a Redis Cluster for the windows shorter than a minute")
	fs.StringVar(&f.perSecond.spec, "redis-per-second-sentinel", "", "a master watched by Redis Sentinel for the windows shorter than a minute, as `master,host:port,...`")
	fs.StringVar(&f.perSecond.user, "redis-per-second-sentinel-user", "", "ACL `user` for the sentinels of --redis-per-second-sentinel")
	fs.StringVar(&f.perSecond.password, "redis-per-second-sentinel-password", "", "`password` of the sentinels of --redis-per-second-sentinel")
	fs.DurationVar(&r.Timeout, "store-timeout", r.Timeout, "how long Redis has to decide a request once rls sends it (rls waits half as long again for the reply; a caller's earlier deadline wins); then --on-store-error decides")
	fs.StringVar(&f.onErr, "on-store-error", "error", "what a request gets when the store fails or times out (`policy`): error (gRPC UNAVAILABLE, HTTP 503: the proxy's failure mode decides), allow (OK) or deny (OVER_LIMIT)")
	fs.StringVar(&f.headers, "response-headers", "off", "rate-limit headers in RateLimitService responses (`mode`): off, draft03 (X-RateLimit-*), draft11 (RateLimit, RateLimit-Policy) or both; /auth and ext_authz always send both")
	fs.StringVar(&f.mem, "memory-limit", formatBytes(c.Store.Memory.MaxBytes), "bound on the memory store's counters (`size`), in bytes or with KiB, MiB, GiB (KB, MB, GB: powers of 1000); the counters closest to expiry are evicted first")
	fs.StringVar(&c.Store.OverridesFile, "overrides-file", "", "memory store: a `file` that keeps the runtime overrides (/admin/overrides, rls override) across restarts, rewritten atomically at each change; empty: in memory only. On Redis they are kept in Redis")
	fs.BoolVar(&r.DenyCache, "deny-cache", r.DenyCache, "Redis store: when Redis says a request is denied until an exact instant, answer the same request from memory until then, with no round trip")
	fs.StringVar(&c.Listeners.AdminTokenFile, "admin-token-file", "", "a `file` holding a bearer token (one line) that lets clients off loopback use /admin/reset and /admin/overrides (read again every second); without it only loopback clients may")
	fs.BoolVar(&c.Listeners.AdminRequireToken, "admin-require-token", false, "require the bearer token of --admin-token-file from every client, loopback ones too, on /admin/ and /debug/ (config, explain, pprof); for a proxy on the same host that forwards outside traffic. Needs --admin-token-file")
	fs.BoolVar(&l.UI, "ui", false, "serve the operator page at /ui/ on the HTTP listener: limits with live decisions, top keys, explain, overrides, reloads, store health; who may open it as --debug-endpoints, its actions as /admin/. Off in --compat mode unless given on the command line")
	fs.StringVar(&f.debug, "debug-endpoints", "loopback", "who may use /debug/config, /debug/explain, /debug/top, /debug/status, /debug/pprof and the page /ui/ (`access`): loopback (clients on a loopback address), on (everyone) or off")
	fs.StringVar(&f.proxies, "trusted-proxies", "", "comma-separated `CIDRs` (or addresses) of the proxies whose X-Forwarded-For /auth and ext_authz believe; empty: /auth believes X-Real-IP and X-Forwarded-For from any peer, ext_authz uses the TCP peer")
	fs.DurationVar(&l.ShutdownTimeout, "shutdown-timeout", l.ShutdownTimeout, "how long SIGTERM waits for in-flight requests before closing the connections")
	fs.BoolVar(&c.Files.Watch, "watch", c.Files.Watch, "reload the config when its files change (SIGHUP always reloads)")
	f.configSizes.define(fs)
	fs.StringVar(&l.TLS.Files.Cert, "tls-cert", "", "PEM certificate `file`: serve TLS on --tls-listeners (re-read when it changes)")
	fs.StringVar(&l.TLS.Files.Key, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.StringVar(&l.TLS.Files.ClientCA, "tls-client-ca", "", "PEM CA `file`: require client certificates signed by it (mutual TLS)")
	fs.StringVar(&f.tlsOn, "tls-listeners", "grpc,http", "the `listeners` that --tls-cert applies to: grpc, http or grpc,http")
	fs.IntVar(&l.HTTP.MaxConnections, "http-max-connections", 0, "bound on open HTTP `connections`; at the bound a new connection closes the one idle longest, else the one stalled longest. 0: half the open-file limit (RLIMIT_NOFILE), at most 10000, leaving the rest to gRPC and Redis")
	fs.DurationVar(&l.HTTP.ReadTimeout, "http-read-timeout", l.HTTP.ReadTimeout, "bound on reading one HTTP request, body included")
	fs.DurationVar(&l.HTTP.WriteTimeout, "http-write-timeout", l.HTTP.WriteTimeout, "bound on writing one HTTP response (and on a /debug/pprof profile's length)")
	fs.DurationVar(&l.HTTP.IdleTimeout, "http-idle-timeout", l.HTTP.IdleTimeout, "close keep-alive HTTP connections idle that long")
	fs.UintVar(&f.grpcMaxStreams, "grpc-max-streams", uint(l.GRPC.MaxStreams), "bound on concurrent gRPC `streams` (requests in flight) per connection; more are refused, and Envoy opens another connection")
	fs.DurationVar(&l.GRPC.MaxConnectionAge, "grpc-max-connection-age", l.GRPC.MaxConnectionAge, "ask a gRPC client to reconnect (GOAWAY) once its connection is this old, so that connections spread over replicas")
	fs.DurationVar(&l.GRPC.MaxConnectionAgeGrace, "grpc-max-connection-age-grace", l.GRPC.MaxConnectionAgeGrace, "after --grpc-max-connection-age, how long requests in flight have before the connection is closed")
	fs.IntVar(&c.Service.MaxValueSeries, "metrics-max-values", c.Service.MaxValueSeries, "bound on the distinct per-value `series` of one limit in rls_descriptor_decisions_total (descriptors with detailed_metric or value_to_metric); further values are counted in descriptor=\""+decisionmetrics.OtherSeries+"\"")
	fs.StringVar(&c.Tracing.Endpoint, "otlp-endpoint", "", "export traces to the OTLP receiver at `host:port` (or an http:// or https:// URL), over gRPC unless OTEL_EXPORTER_OTLP_PROTOCOL says http/protobuf; empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT, else no OTLP. OTEL_TRACES_EXPORTER=console prints the spans on stdout instead (otlp,console: both)")
	fs.BoolVar(&f.otlpInsecure, "otlp-insecure", false, "send traces to a host:port --otlp-endpoint in plain text (true) or over TLS (false); unset: plain text to a loopback address, TLS elsewhere")
	fs.StringVar(&f.level, "log-level", "info", "least `level` logged: debug, info, warn or error")
	fs.StringVar(&c.Logging.Format, "log-format", c.Logging.Format, "log `format`: text or json")
	fs.StringVar(&f.compatMode, "compat", "", "`mode`: envoy-ratelimit takes every setting from envoyproxy/ratelimit's environment variables (HOST, PORT, GRPC_PORT, CONFIG_TYPE, REDIS_URL, ...) instead of rls's flags, as when rls is started as ratelimit; see docs/migrating-from-envoy-ratelimit.md")
	fs.BoolVar(&c.Service.ShadowAll, "shadow", false, "every limit in shadow mode: counted, denials in rls_shadow_denials_total, nothing denied (rls_shadow_mode is 1)")
	fs.BoolVar(&c.Service.CountDeniedHits, "count-denied-hits", false, "every limit's hits count even when the request is denied, as envoyproxy/ratelimit counts them (default: a denied request consumes nothing)")
	fs.BoolVar(&f.referenceStats, "reference-stats", false, "also export envoyproxy/ratelimit's per-limit stats on /metrics, as its Prometheus mapping names them (ratelimit_service_rate_limit_*{domain,key1,key2})")
	f.defineInsight(fs)
	return fs, f
}

// defineInsight defines the flags of the top keys and the decision log.
func (f *serveFlags) defineInsight(fs *flag.FlagSet) {
	c := &f.cfg
	fs.IntVar(&c.TopKeys.K, "top-keys", c.TopKeys.K, "`keys` kept per limit in each ranking (denied, fullness) for GET /debug/top and rls top, whatever the number of distinct keys; 0 turns top keys off")
	fs.DurationVar(&c.TopKeys.Publish, "top-keys-publish", c.TopKeys.Publish, "on Redis: how often each rls publishes its top keys for the others (GET /debug/top merges them)")
	fs.StringVar(&c.DecisionLog.Path, "decision-log", "", "write one JSON line per decision to this `file` (- for stdout), for rls replay; off when empty")
	fs.Float64Var(&c.DecisionLog.Sample, "decision-log-sample", c.DecisionLog.Sample, "the `share` of keys (0 < F ≤ 1) whose decisions are all logged, chosen by a hash of the key (the same in every rls)")
	fs.StringVar(&f.decisionLog.hashKeyFile, "decision-log-hash-key", "", "a `file` holding a secret: descriptor values the config does not name exactly are logged as keyed hashes of it (no client addresses in the log)")
	fs.StringVar(&f.decisionLog.maxSize, "decision-log-max-size", formatBytes(c.DecisionLog.MaxBytes), "bound on one decision log file (`size`, as --memory-limit); past it the file is renamed FILE.1 (FILE.1 to FILE.2...) and a new one started")
	fs.IntVar(&c.DecisionLog.Backups, "decision-log-backups", c.DecisionLog.Backups, "rotated decision log `files` kept (0: none)")
	fs.IntVar(&c.DecisionLog.Queue, "decision-log-queue", c.DecisionLog.Queue, "`records` waiting for the decision log's writer; past it records are dropped and counted (rls_decision_log_dropped_total), decisions never wait")
}

// parseServeFlags parses args, falling back to RLS_<FLAG> variables of env
// for flags not given on the command line, checks the values and returns
// the server's Config: rls's own front end. With --compat envoy-ratelimit
// the Config is envoyproxy/ratelimit's environment's (internal/compat)
// instead. On -h or --help it prints serve's help on stdout and returns
// flag.ErrHelp.
func parseServeFlags(args, env []string, stdout io.Writer) (daemon.Config, error) {
	fs, f := newServeFlagSet()
	if err := commandFlags("serve", fs, args, stdout); err != nil {
		return daemon.Config{}, err
	}
	if fs.NArg() > 0 {
		return daemon.Config{}, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	fromEnv, err := applyEnv(fs, env)
	if err != nil {
		return daemon.Config{}, usageError{err}
	}
	switch f.compatMode {
	case "":
	case compat.Mode:
		cfg, err := compat.FromEnv(env)
		if err != nil {
			return daemon.Config{}, usageError{err}
		}
		// The reference has no page: only --ui on the command line asks.
		fs.Visit(func(fl *flag.Flag) {
			cfg.Listeners.UI = cfg.Listeners.UI || fl.Name == "ui" && !fromEnv["ui"] && f.cfg.Listeners.UI
		})
		return cfg, nil
	default:
		return daemon.Config{}, usageError{fmt.Errorf("--compat: %q is not %s", f.compatMode, compat.Mode)}
	}
	bad := func(name string, e error) error {
		if fromEnv[name] {
			return usageError{fmt.Errorf("%s (--%s): %w", envName(name), name, e)}
		}
		return usageError{fmt.Errorf("--%s: %w", name, e)}
	}
	for _, check := range []func(bad func(string, error) error) error{f.config, f.store, f.redisTopology, f.policies, f.network, f.limits, f.tls, f.logging, f.insight} {
		if err := check(bad); err != nil {
			return daemon.Config{}, err
		}
	}
	insecureSet := false
	fs.Visit(func(fl *flag.Flag) { insecureSet = insecureSet || fl.Name == "otlp-insecure" })
	if err := f.tracing(env, insecureSet, stdout, bad); err != nil {
		return daemon.Config{}, err
	}
	c := &f.cfg
	if f.referenceStats {
		c.Plugins.Start = compat.ReferenceStats
	}
	if c.DecisionLog.Path == "-" {
		c.DecisionLog.Stdout = stdout
	}
	c.Names = daemon.Names{GRPCAddr: "--grpc-addr", HTTPAddr: "--http-addr", Redis: "--store=redis"}
	return *c, nil
}

// config checks the flags of config loading.
func (f *serveFlags) config(bad func(string, error) error) error {
	o, name, err := f.configSizes.parse()
	if err != nil {
		return bad(name, err)
	}
	f.cfg.Files.Limits = o
	return nil
}

// store checks the flags of the counter store.
func (f *serveFlags) store(bad func(string, error) error) error {
	c := &f.cfg.Store
	switch k := daemon.StoreKind(f.kind); k {
	case daemon.Memory, daemon.Redis:
		c.Kind = k
	default:
		return bad("store", fmt.Errorf("%q is not one of memory|redis", f.kind))
	}
	c.Redis.ClusterSeeds = daemon.SplitList(f.cluster)
	if c.Redis.Timeout <= 0 {
		return bad("store-timeout", fmt.Errorf("%s is not positive", c.Redis.Timeout))
	}
	var err error
	if c.Memory.MaxBytes, err = parseBytes(f.mem); err != nil {
		return bad("memory-limit", err)
	}
	if c.Memory.MaxBytes < memstore.MinMaxBytes {
		return bad("memory-limit", fmt.Errorf("%s is less than the minimum of %d bytes", f.mem, memstore.MinMaxBytes))
	}
	if c.OverridesFile != "" && c.Kind == daemon.Redis {
		return bad("overrides-file", errors.New("is for --store memory: on Redis the overrides are kept in Redis, beside the counters"))
	}
	return nil
}

// redisTopology checks the flags of Redis Sentinel and of the per-second
// Redis (after store).
func (f *serveFlags) redisTopology(bad func(string, error) error) error {
	r := &f.cfg.Store.Redis
	sen, name, err := f.sentinel.parse("redis-sentinel")
	if err != nil {
		return bad(name, err)
	}
	if sen != nil && len(r.ClusterSeeds) > 0 {
		return bad("redis-sentinel", errors.New("--redis-cluster is set too; choose one"))
	}
	r.Sentinel = sen
	if sen, name, err = f.perSecond.parse("redis-per-second-sentinel"); err != nil {
		return bad(name, err)
	}
	cluster := daemon.SplitList(f.perSecondCluster)
	if f.perSecondURL == "" && len(cluster) == 0 && sen == nil {
		return nil
	}
	if sen != nil && len(cluster) > 0 {
		return bad("redis-per-second-sentinel", errors.New("--redis-per-second-cluster is set too; choose one"))
	}
	ps := &redisstore.Options{URL: f.perSecondURL, ClusterSeeds: cluster, Sentinel: sen, CAFile: r.CAFile, CertFile: r.CertFile, KeyFile: r.KeyFile,
		TLSSkipHostname: r.TLSSkipHostname, PoolSize: r.PoolSize}
	if ps.URL == "" {
		ps.URL = r.URL // for the credentials and TLS of a cluster or Sentinel
	}
	r.PerSecond = ps
	return nil
}

// parse returns the Sentinel of the flags named after flag (nil when
// unset), or the name of the bad flag and why.
func (s sentinelFlags) parse(flag string) (*redisstore.Sentinel, string, error) {
	if s.spec == "" {
		if s.user != "" || s.password != "" {
			return nil, flag + "-password", fmt.Errorf("--%s-user and --%s-password need --%s", flag, flag, flag)
		}
		return nil, "", nil
	}
	sen, err := daemon.ParseSentinel(s.spec)
	if err != nil {
		return nil, flag, err
	}
	sen.Username, sen.Password = s.user, s.password
	return sen, "", nil
}

// policies checks the flags that shape answers.
func (f *serveFlags) policies(bad func(string, error) error) error {
	c := &f.cfg.Service
	var err error
	if c.OnStoreError, err = service.ParseStoreErrorPolicy(f.onErr); err != nil {
		return bad("on-store-error", err)
	}
	if c.Headers, err = service.ParseHeaderMode(f.headers); err != nil {
		return bad("response-headers", err)
	}
	return nil
}

// network checks who may use what on the listeners.
func (f *serveFlags) network(bad func(string, error) error) error {
	l := &f.cfg.Listeners
	var err error
	if l.Debug, err = httpapi.ParseDebugAccess(f.debug); err != nil {
		return bad("debug-endpoints", err)
	}
	if l.AdminRequireToken && l.AdminTokenFile == "" {
		return bad("admin-require-token", errors.New("needs --admin-token-file (the token that every client must then send)"))
	}
	if f.proxies == "" {
		return nil
	}
	for _, s := range strings.Split(f.proxies, ",") {
		p, err := parsePrefix(strings.TrimSpace(s))
		if err != nil {
			return bad("trusted-proxies", err)
		}
		l.TrustedProxies = append(l.TrustedProxies, p)
	}
	return nil
}

// limits checks the bounds on what clients can hold.
func (f *serveFlags) limits(bad func(string, error) error) error {
	l := &f.cfg.Listeners
	if l.HTTP.MaxConnections < 0 {
		return bad("http-max-connections", fmt.Errorf("%d is negative", l.HTTP.MaxConnections))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"http-read-timeout", l.HTTP.ReadTimeout},
		{"http-write-timeout", l.HTTP.WriteTimeout},
		{"http-idle-timeout", l.HTTP.IdleTimeout},
		{"grpc-max-connection-age", l.GRPC.MaxConnectionAge},
		{"grpc-max-connection-age-grace", l.GRPC.MaxConnectionAgeGrace},
	} {
		if d.v <= 0 {
			return bad(d.name, fmt.Errorf("%s is not positive", d.v))
		}
	}
	// Headers are read within the read timeout.
	l.HTTP.ReadHeaderTimeout = l.HTTP.ReadTimeout
	if f.grpcMaxStreams == 0 || f.grpcMaxStreams > math.MaxUint32 {
		return bad("grpc-max-streams", fmt.Errorf("%d is not between 1 and %d", f.grpcMaxStreams, uint32(math.MaxUint32)))
	}
	l.GRPC.MaxStreams = uint32(f.grpcMaxStreams)
	if n := f.cfg.Service.MaxValueSeries; n < 1 {
		return bad("metrics-max-values", fmt.Errorf("%d is less than 1", n))
	}
	return nil
}

// tls checks the TLS files and which listeners they apply to.
func (f *serveFlags) tls(bad func(string, error) error) error {
	t := &f.cfg.Listeners.TLS
	if (t.Files.Cert == "") != (t.Files.Key == "") {
		return bad("tls-cert", errors.New("--tls-cert and --tls-key go together"))
	}
	if t.Files.ClientCA != "" && t.Files.Cert == "" {
		return bad("tls-client-ca", errors.New("needs --tls-cert and --tls-key"))
	}
	if t.Files.Cert == "" {
		return nil
	}
	for _, l := range strings.Split(f.tlsOn, ",") {
		switch strings.TrimSpace(l) {
		case "grpc":
			t.GRPC = true
		case "http":
			t.HTTP = true
		default:
			return bad("tls-listeners", fmt.Errorf("%q is not grpc or http", l))
		}
	}
	return nil
}

// logging checks the log flags.
func (f *serveFlags) logging(bad func(string, error) error) error {
	c := &f.cfg.Logging
	if err := c.Level.UnmarshalText([]byte(f.level)); err != nil {
		return bad("log-level", fmt.Errorf("%q is not one of debug|info|warn|error", f.level))
	}
	if c.Format != "text" && c.Format != "json" {
		return bad("log-format", fmt.Errorf("%q is not one of text|json", c.Format))
	}
	return nil
}

// minHashKey is the shortest secret --decision-log-hash-key takes.
const minHashKey = 16

// insight checks the flags of the top keys and the decision log, and
// reads the hash key's file.
func (f *serveFlags) insight(bad func(string, error) error) error {
	c := &f.cfg
	if c.TopKeys.K < 0 || c.TopKeys.K > 10000 {
		return bad("top-keys", fmt.Errorf("%d is not between 0 and 10000", c.TopKeys.K))
	}
	if c.TopKeys.Publish <= 0 {
		return bad("top-keys-publish", fmt.Errorf("%s is not positive", c.TopKeys.Publish))
	}
	d := &c.DecisionLog
	if s := d.Sample; !(s > 0 && s <= 1) {
		return bad("decision-log-sample", fmt.Errorf("%v is not in (0, 1]", s))
	}
	var err error
	if d.MaxBytes, err = parseBytes(f.decisionLog.maxSize); err != nil || d.MaxBytes < 4096 {
		return bad("decision-log-max-size", fmt.Errorf("%q is not a size of 4096 bytes or more", f.decisionLog.maxSize))
	}
	if d.Backups < 0 {
		return bad("decision-log-backups", fmt.Errorf("%d is negative", d.Backups))
	}
	if d.Queue < 1 {
		return bad("decision-log-queue", fmt.Errorf("%d is less than 1", d.Queue))
	}
	if p := f.decisionLog.hashKeyFile; p != "" {
		key, err := os.ReadFile(p)
		if err != nil {
			return bad("decision-log-hash-key", err)
		}
		if key = bytes.TrimSpace(key); len(key) < minHashKey {
			return bad("decision-log-hash-key", fmt.Errorf("%s holds %d bytes, fewer than %d: a short secret is guessed", p, len(key), minHashKey))
		}
		d.HashKey = key
	}
	if (d.Path == "") && (f.decisionLog.hashKeyFile != "" || d.Sample != 1) {
		return bad("decision-log-sample", errors.New("--decision-log-sample and --decision-log-hash-key need --decision-log"))
	}
	return nil
}

// tracing checks the flags of tracing and reads the standard OTEL_
// variables of env that say whether and where spans go (the SDK reads the
// others itself, from the process's environment: see internal/tracing).
// insecureSet says whether --otlp-insecure was given (or RLS_OTLP_INSECURE);
// stdout receives the spans when OTEL_TRACES_EXPORTER names console.
func (f *serveFlags) tracing(env []string, insecureSet bool, stdout io.Writer, bad func(string, error) error) error {
	t := &f.cfg.Tracing
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	if strings.EqualFold(strings.TrimSpace(vars["OTEL_SDK_DISABLED"]), "true") {
		*t = tracing.Config{}
		return nil
	}
	otlp, console, err := traceExporters(vars["OTEL_TRACES_EXPORTER"])
	if err != nil {
		return usageError{fmt.Errorf("OTEL_TRACES_EXPORTER: %w", err)}
	}
	if console {
		t.Console = stdout
	}
	// first returns the first of the variables names that is set (not
	// empty), and its name.
	first := func(names ...string) (string, string) {
		for _, n := range names {
			if v := vars[n]; v != "" {
				return v, n
			}
		}
		return "", ""
	}
	// --otlp-endpoint is asked for by name: it applies whatever
	// OTEL_TRACES_EXPORTER says.
	fromEnv := t.Endpoint == ""
	if fromEnv && otlp {
		t.Endpoint = vars["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
		t.BaseEndpoint = vars["OTEL_EXPORTER_OTLP_ENDPOINT"]
	}
	if !t.On() {
		return nil
	}
	if v, name := first("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); v != "" {
		p, err := tracing.ParseProtocol(v)
		if err != nil {
			return usageError{fmt.Errorf("%s: %w", name, err)}
		}
		t.Protocol = p
	}
	switch v, name := first("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"); {
	case insecureSet:
		t.TLS = tracing.TLSOn
		if f.otlpInsecure {
			t.TLS = tracing.TLSOff
		}
	case v != "":
		insecure, err := strconv.ParseBool(v)
		if err != nil {
			return usageError{fmt.Errorf("%s=%q: not true or false", name, v)}
		}
		t.TLS = tracing.TLSOn
		if insecure {
			t.TLS = tracing.TLSOff
		}
	}
	t.ServiceName = vars["OTEL_SERVICE_NAME"]
	if err := t.Check(); err != nil {
		if fromEnv {
			_, name := first("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
			return usageError{fmt.Errorf("%s: %w", name, err)}
		}
		return bad("otlp-endpoint", err)
	}
	return nil
}

// traceExporters reads OTEL_TRACES_EXPORTER: a comma-separated list of
// otlp (the default when empty), console (spans on stdout) and none.
func traceExporters(v string) (otlp, console bool, err error) {
	if strings.TrimSpace(v) == "" {
		return true, false, nil
	}
	for _, e := range strings.Split(v, ",") {
		switch strings.ToLower(strings.TrimSpace(e)) {
		case "otlp":
			otlp = true
		case "console":
			console = true
		case "none":
		default:
			return false, false, fmt.Errorf("%q is not otlp, console or none (rls exports no other way)", strings.TrimSpace(e))
		}
	}
	return otlp, console, nil
}

// applyEnv sets every flag not given on the command line from its
// RLS_<FLAG> variable, when env has it with a value (an empty variable is
// as good as unset, as compose files and Kubernetes manifests often leave
// them). It returns the names of the flags it set.
func applyEnv(fs *flag.FlagSet, env []string) (map[string]bool, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	var err error
	fromEnv := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := envName(f.Name)
		if v := vars[name]; v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
			fromEnv[f.Name] = true
		}
	})
	return fromEnv, err
}

// envName returns the environment variable of a flag: RLS_ + upper case,
// '-' → '_'.
func envName(flag string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// formatBytes writes n as parseBytes reads it, in the largest binary unit
// that divides it.
func formatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// parseBytes parses "1048576", "512KiB", "256MiB", "1GiB" (also KB, MB, GB
// as powers of 1000).
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size such as 268435456 or 256MiB", s)
	}
	return n * mult, nil
}

// parsePrefix parses a CIDR or a single address.
func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an IP address", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
