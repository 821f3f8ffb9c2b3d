package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tlsfiles"
)

// options are the serve flags, after parsing and checking.
type options struct {
	config          string
	grpcAddr        string
	httpAddr        string
	store           string
	redisURL        string
	redisCluster    []string
	redisPrefix     string
	redisCA         string
	redisCert       string
	redisKey        string
	redisPoolSize   int
	storeTimeout    time.Duration
	onStoreError    service.StoreErrorPolicy
	responseHeaders service.HeaderMode
	memoryLimit     int64
	denyCache       bool
	debug           httpapi.DebugAccess
	trustedProxies  []netip.Prefix
	shutdownTimeout time.Duration
	watch           bool
	tls             tlsfiles.Files
	tlsGRPC         bool
	tlsHTTP         bool
	logLevel        slog.Level
	logFormat       string
	maxValueSeries  int
	configLimits    config.LoadOptions
	httpLimits      httpapi.Limits
	grpcLimits      grpcserver.Limits

	// Compatibility with envoyproxy/ratelimit (compat.go).
	compatMode      string           // --compat: "" or envoy-ratelimit
	compat          *compatOptions   // the reference's settings; nil in rls's own mode
	countDeniedHits bool             // --count-denied-hits
	reference       referenceOptions // the reference's behaviours asked for
	referenceStats  bool             // --reference-stats

	// Redis Sentinel (--redis-sentinel), TLS without the host name check,
	// and the Redis of per-second windows (--redis-per-second-*; nil: none).
	redisSentinel        *redisstore.Sentinel
	redisTLSSkipHostname bool
	redisPerSecond       *redisTarget
}

// redisTarget is where a second Redis store connects (the per-second one):
// the fields of redisstore.Options that differ from one Redis to another.
type redisTarget struct {
	url           string
	cluster       []string
	sentinel      *redisstore.Sentinel
	ca, cert, key string
	skipHostname  bool
	poolSize      int
}

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
// options that take a flag's value as it is, and the text of the others.
type serveFlags struct {
	o                                                          options
	cluster, onErr, headers, debug, proxies, level, mem, tlsOn string
	grpcMaxStreams                                             uint
	configSizes                                                configSizes
	sentinel, perSecond                                        sentinelFlags
	perSecondURL, perSecondCluster                             string
}

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

// newServeFlagSet defines the serve flags on a new FlagSet.
func newServeFlagSet() (*flag.FlagSet, *serveFlags) {
	fs := flag.NewFlagSet("rls serve", flag.ContinueOnError)
	f := &serveFlags{}
	o := &f.o
	fs.StringVar(&o.config, "config", "config/limits.yaml", "a YAML `path`: a file, or a directory whose *.yaml and *.yml files (subdirectories included) are all loaded")
	fs.StringVar(&o.grpcAddr, "grpc-addr", ":8081", "gRPC listen `address`: RateLimitService, Authorization (ext_authz), health, reflection")
	fs.StringVar(&o.httpAddr, "http-addr", ":8080", "HTTP listen `address`: /healthz, /readyz, /metrics, /json, /auth/{domain}, /debug/")
	fs.StringVar(&o.store, "store", "memory", "where counters live (`kind`): memory (embedded, one process) or redis (shared by every rls on it)")
	fs.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis `URL`: redis:// or rediss:// (TLS), user and password in the URL; with --redis-cluster or --redis-sentinel, only its credentials and TLS (and database) count")
	fs.StringVar(&f.cluster, "redis-cluster", "", "comma-separated `host:port` seeds of a Redis Cluster; when set, cluster mode")
	fs.StringVar(&o.redisPrefix, "redis-prefix", "rls:", "`prefix` of every Redis key (several rls deployments can share one Redis)")
	fs.StringVar(&o.redisCA, "redis-ca", "", "PEM `file` of the CA that signs Redis's certificate (rediss:// with a private CA)")
	fs.StringVar(&o.redisCert, "redis-cert", "", "PEM `file` of a client certificate to present to Redis (rediss://, Redis's tls-auth-clients); re-read at every connection")
	fs.StringVar(&o.redisKey, "redis-key", "", "PEM `file` of the key of --redis-cert")
	fs.IntVar(&o.redisPoolSize, "redis-pool-size", 0, "Redis `connections` per node (0: 10 per CPU)")
	fs.StringVar(&f.sentinel.spec, "redis-sentinel", "", "a master watched by Redis Sentinel, as `master,host:port,...`: its name, then its sentinels' addresses; rls follows its failovers. --redis-url gives the master's credentials, database and TLS")
	fs.StringVar(&f.sentinel.user, "redis-sentinel-user", "", "ACL `user` for the sentinels of --redis-sentinel (not the master's)")
	fs.StringVar(&f.sentinel.password, "redis-sentinel-password", "", "`password` of the sentinels of --redis-sentinel (their requirepass; not the master's)")
	fs.BoolVar(&o.redisTLSSkipHostname, "redis-tls-skip-hostname", false, "rediss://: verify Redis's certificate chain but not that it names the host reached (Sentinel gives masters' IP addresses), as envoyproxy/ratelimit's REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	fs.StringVar(&f.perSecondURL, "redis-per-second-url", "", "Redis `URL` of a second Redis for the windows shorter than a minute (unit: second), as envoyproxy/ratelimit's REDIS_PERSECOND; decisions stay all-or-nothing across both. With --redis-per-second-cluster or --redis-per-second-sentinel, its credentials and TLS (default: --redis-url's)")
	fs.StringVar(&f.perSecondCluster, "redis-per-second-cluster", "", "comma-separated `host:port` seeds of a Redis Cluster for the windows shorter than a minute")
	fs.StringVar(&f.perSecond.spec, "redis-per-second-sentinel", "", "a master watched by Redis Sentinel for the windows shorter than a minute, as `master,host:port,...`")
	fs.StringVar(&f.perSecond.user, "redis-per-second-sentinel-user", "", "ACL `user` for the sentinels of --redis-per-second-sentinel")
	fs.StringVar(&f.perSecond.password, "redis-per-second-sentinel-password", "", "`password` of the sentinels of --redis-per-second-sentinel")
	fs.DurationVar(&o.storeTimeout, "store-timeout", 10*time.Millisecond, "how long Redis has to decide a request once rls sends it (rls waits half as long again for the reply; a caller's earlier deadline wins); then --on-store-error decides")
	fs.StringVar(&f.onErr, "on-store-error", "error", "what a request gets when the store fails or times out (`policy`): error (gRPC UNAVAILABLE, HTTP 503: the proxy's failure mode decides), allow (OK) or deny (OVER_LIMIT)")
	fs.StringVar(&f.headers, "response-headers", "off", "rate-limit headers in RateLimitService responses (`mode`): off, draft03 (X-RateLimit-*), draft11 (RateLimit, RateLimit-Policy) or both; /auth and ext_authz always send both")
	fs.StringVar(&f.mem, "memory-limit", "256MiB", "bound on the memory store's counters (`size`), in bytes or with KiB, MiB, GiB (KB, MB, GB: powers of 1000); the counters closest to expiry are evicted first")
	fs.BoolVar(&o.denyCache, "deny-cache", true, "Redis store: when Redis says a request is denied until an exact instant, answer the same request from memory until then, with no round trip")
	fs.StringVar(&f.debug, "debug-endpoints", "loopback", "who may use /debug/config, /debug/explain and /debug/pprof (`access`): loopback (clients on a loopback address), on (everyone) or off")
	fs.StringVar(&f.proxies, "trusted-proxies", "", "comma-separated `CIDRs` (or addresses) of the proxies whose X-Forwarded-For /auth and ext_authz believe; empty: /auth believes X-Real-IP and X-Forwarded-For from any peer, ext_authz uses the TCP peer")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long SIGTERM waits for in-flight requests before closing the connections")
	fs.BoolVar(&o.watch, "watch", true, "reload the config when its files change (SIGHUP always reloads)")
	f.configSizes.define(fs)
	fs.StringVar(&o.tls.Cert, "tls-cert", "", "PEM certificate `file`: serve TLS on --tls-listeners (re-read when it changes)")
	fs.StringVar(&o.tls.Key, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.StringVar(&o.tls.ClientCA, "tls-client-ca", "", "PEM CA `file`: require client certificates signed by it (mutual TLS)")
	fs.StringVar(&f.tlsOn, "tls-listeners", "grpc,http", "the `listeners` that --tls-cert applies to: grpc, http or grpc,http")
	fs.IntVar(&o.httpLimits.MaxConnections, "http-max-connections", 0, "bound on open HTTP `connections`; at the bound a new connection closes the one idle longest, else the one stalled longest. 0: half the open-file limit (RLIMIT_NOFILE), at most 10000, leaving the rest to gRPC and Redis")
	fs.DurationVar(&o.httpLimits.ReadTimeout, "http-read-timeout", httpapi.DefaultReadTimeout, "bound on reading one HTTP request, body included")
	fs.DurationVar(&o.httpLimits.WriteTimeout, "http-write-timeout", httpapi.DefaultWriteTimeout, "bound on writing one HTTP response (and on a /debug/pprof profile's length)")
	fs.DurationVar(&o.httpLimits.IdleTimeout, "http-idle-timeout", httpapi.DefaultIdleTimeout, "close keep-alive HTTP connections idle that long")
	fs.UintVar(&f.grpcMaxStreams, "grpc-max-streams", grpcserver.DefaultMaxStreams, "bound on concurrent gRPC `streams` (requests in flight) per connection; more are refused, and Envoy opens another connection")
	fs.DurationVar(&o.grpcLimits.MaxConnectionAge, "grpc-max-connection-age", grpcserver.DefaultMaxConnectionAge, "ask a gRPC client to reconnect (GOAWAY) once its connection is this old, so that connections spread over replicas")
	fs.DurationVar(&o.grpcLimits.MaxConnectionAgeGrace, "grpc-max-connection-age-grace", grpcserver.DefaultMaxConnectionAgeGrace, "after --grpc-max-connection-age, how long requests in flight have before the connection is closed")
	fs.IntVar(&o.maxValueSeries, "metrics-max-values", service.DefaultMaxValueSeries, "bound on the distinct per-value `series` of one limit in rls_descriptor_decisions_total (descriptors with detailed_metric or value_to_metric); further values are counted in descriptor=\""+service.OtherSeries+"\"")
	fs.StringVar(&f.level, "log-level", "info", "least `level` logged: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&o.compatMode, "compat", "", "`mode`: envoy-ratelimit takes every setting from envoyproxy/ratelimit's environment variables (HOST, PORT, GRPC_PORT, CONFIG_TYPE, REDIS_URL, ...) instead of rls's flags, as when rls is started as ratelimit; see docs/migrating-from-envoy-ratelimit.md")
	fs.BoolVar(&o.countDeniedHits, "count-denied-hits", false, "every limit's hits count even when the request is denied, as envoyproxy/ratelimit counts them (default: a denied request consumes nothing)")
	fs.BoolVar(&o.referenceStats, "reference-stats", false, "also export envoyproxy/ratelimit's per-limit stats on /metrics, as its Prometheus mapping names them (ratelimit_service_rate_limit_*{domain,key1,key2})")
	return fs, f
}

// parseServeFlags parses args, falling back to RLS_<FLAG> variables of env
// for flags not given on the command line, and checks the values. On -h or
// --help it prints serve's help on stdout and returns flag.ErrHelp.
func parseServeFlags(args, env []string, stdout io.Writer) (*options, error) {
	fs, f := newServeFlagSet()
	if err := commandFlags("serve", fs, args, stdout); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	fromEnv, err := applyEnv(fs, env)
	if err != nil {
		return nil, usageError{err}
	}
	switch f.o.compatMode {
	case "":
	case compatEnvoyRatelimit:
		return compatFromEnv(env)
	default:
		return nil, usageError{fmt.Errorf("--compat: %q is not %s", f.o.compatMode, compatEnvoyRatelimit)}
	}
	if f.o.referenceStats {
		f.o.reference.stats = true
	}
	bad := func(name string, e error) error {
		if fromEnv[name] {
			return usageError{fmt.Errorf("%s (--%s): %w", envName(name), name, e)}
		}
		return usageError{fmt.Errorf("--%s: %w", name, e)}
	}
	for _, check := range []func(bad func(string, error) error) error{f.config, f.store, f.redisTopology, f.policies, f.network, f.limits, f.tls, f.logging} {
		if err := check(bad); err != nil {
			return nil, err
		}
	}
	return &f.o, nil
}

// config checks the flags of config loading.
func (f *serveFlags) config(bad func(string, error) error) error {
	o, name, err := f.configSizes.parse()
	if err != nil {
		return bad(name, err)
	}
	f.o.configLimits = o
	return nil
}

// store checks the flags of the counter store.
func (f *serveFlags) store(bad func(string, error) error) error {
	o := &f.o
	if o.store != "memory" && o.store != "redis" {
		return bad("store", fmt.Errorf("%q is not one of memory|redis", o.store))
	}
	o.redisCluster = splitList(f.cluster)
	if o.storeTimeout <= 0 {
		return bad("store-timeout", fmt.Errorf("%s is not positive", o.storeTimeout))
	}
	var err error
	if o.memoryLimit, err = parseBytes(f.mem); err != nil {
		return bad("memory-limit", err)
	}
	if o.memoryLimit < memstore.MinMaxBytes {
		return bad("memory-limit", fmt.Errorf("%s is less than the minimum of %d bytes", f.mem, memstore.MinMaxBytes))
	}
	return nil
}

// redisTopology checks the flags of Redis Sentinel and of the per-second
// Redis (after store).
func (f *serveFlags) redisTopology(bad func(string, error) error) error {
	o := &f.o
	sen, name, err := f.sentinel.parse("redis-sentinel")
	if err != nil {
		return bad(name, err)
	}
	if sen != nil && len(o.redisCluster) > 0 {
		return bad("redis-sentinel", errors.New("--redis-cluster is set too; choose one"))
	}
	o.redisSentinel = sen
	if sen, name, err = f.perSecond.parse("redis-per-second-sentinel"); err != nil {
		return bad(name, err)
	}
	cluster := splitList(f.perSecondCluster)
	if f.perSecondURL == "" && len(cluster) == 0 && sen == nil {
		return nil
	}
	if sen != nil && len(cluster) > 0 {
		return bad("redis-per-second-sentinel", errors.New("--redis-per-second-cluster is set too; choose one"))
	}
	t := &redisTarget{url: f.perSecondURL, cluster: cluster, sentinel: sen, ca: o.redisCA, cert: o.redisCert, key: o.redisKey,
		skipHostname: o.redisTLSSkipHostname, poolSize: o.redisPoolSize}
	if t.url == "" {
		t.url = o.redisURL // for the credentials and TLS of a cluster or Sentinel
	}
	o.redisPerSecond = t
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
	sen, err := parseSentinel(s.spec)
	if err != nil {
		return nil, flag, err
	}
	sen.Username, sen.Password = s.user, s.password
	return sen, "", nil
}

// parseSentinel reads a master's name and its sentinels' addresses as
// envoyproxy/ratelimit's REDIS_URL gives them: master,host:port,host:port.
func parseSentinel(spec string) (*redisstore.Sentinel, error) {
	parts := splitList(spec)
	if len(parts) < 2 {
		return nil, fmt.Errorf("%q is not master,host:port[,host:port...] (a master's name, then its sentinels)", spec)
	}
	for _, a := range parts[1:] {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, fmt.Errorf("%q: sentinel %q is not host:port", spec, a)
		}
	}
	return &redisstore.Sentinel{Master: parts[0], Addrs: parts[1:]}, nil
}

// policies checks the flags that shape answers.
func (f *serveFlags) policies(bad func(string, error) error) error {
	var err error
	if f.o.onStoreError, err = service.ParseStoreErrorPolicy(f.onErr); err != nil {
		return bad("on-store-error", err)
	}
	if f.o.responseHeaders, err = service.ParseHeaderMode(f.headers); err != nil {
		return bad("response-headers", err)
	}
	return nil
}

// network checks who may use what on the listeners.
func (f *serveFlags) network(bad func(string, error) error) error {
	var err error
	if f.o.debug, err = httpapi.ParseDebugAccess(f.debug); err != nil {
		return bad("debug-endpoints", err)
	}
	if f.proxies == "" {
		return nil
	}
	for _, s := range strings.Split(f.proxies, ",") {
		p, err := parsePrefix(strings.TrimSpace(s))
		if err != nil {
			return bad("trusted-proxies", err)
		}
		f.o.trustedProxies = append(f.o.trustedProxies, p)
	}
	return nil
}

// limits checks the bounds on what clients can hold.
func (f *serveFlags) limits(bad func(string, error) error) error {
	o := &f.o
	if o.httpLimits.MaxConnections < 0 {
		return bad("http-max-connections", fmt.Errorf("%d is negative", o.httpLimits.MaxConnections))
	}
	if o.httpLimits.MaxConnections == 0 {
		o.httpLimits.MaxConnections = httpConnectionShare(openFileLimit())
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"http-read-timeout", o.httpLimits.ReadTimeout},
		{"http-write-timeout", o.httpLimits.WriteTimeout},
		{"http-idle-timeout", o.httpLimits.IdleTimeout},
		{"grpc-max-connection-age", o.grpcLimits.MaxConnectionAge},
		{"grpc-max-connection-age-grace", o.grpcLimits.MaxConnectionAgeGrace},
	} {
		if d.v <= 0 {
			return bad(d.name, fmt.Errorf("%s is not positive", d.v))
		}
	}
	// Headers are read within the read timeout.
	o.httpLimits.ReadHeaderTimeout = o.httpLimits.ReadTimeout
	if f.grpcMaxStreams == 0 || f.grpcMaxStreams > math.MaxUint32 {
		return bad("grpc-max-streams", fmt.Errorf("%d is not between 1 and %d", f.grpcMaxStreams, uint32(math.MaxUint32)))
	}
	o.grpcLimits.MaxStreams = uint32(f.grpcMaxStreams)
	if o.maxValueSeries < 1 {
		return bad("metrics-max-values", fmt.Errorf("%d is less than 1", o.maxValueSeries))
	}
	return nil
}

// httpConnectionShare is the default bound on HTTP connections for a
// process that may open nofile files: half of them, so that a flood of HTTP
// connections leaves the other half to gRPC connections, Redis and config
// files; at least 16, at most 10,000.
func httpConnectionShare(nofile uint64) int {
	return int(min(max(nofile/2, 16), 10000))
}

// openFileLimit returns the process's soft RLIMIT_NOFILE (1024 when it
// cannot be read).
func openFileLimit() uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return lim.Cur
}

// tls checks the TLS files and which listeners they apply to.
func (f *serveFlags) tls(bad func(string, error) error) error {
	o := &f.o
	if (o.tls.Cert == "") != (o.tls.Key == "") {
		return bad("tls-cert", errors.New("--tls-cert and --tls-key go together"))
	}
	if o.tls.ClientCA != "" && o.tls.Cert == "" {
		return bad("tls-client-ca", errors.New("needs --tls-cert and --tls-key"))
	}
	if o.tls.Cert == "" {
		return nil
	}
	for _, l := range strings.Split(f.tlsOn, ",") {
		switch strings.TrimSpace(l) {
		case "grpc":
			o.tlsGRPC = true
		case "http":
			o.tlsHTTP = true
		default:
			return bad("tls-listeners", fmt.Errorf("%q is not grpc or http", l))
		}
	}
	return nil
}

// logging checks the log flags.
func (f *serveFlags) logging(bad func(string, error) error) error {
	if err := f.o.logLevel.UnmarshalText([]byte(f.level)); err != nil {
		return bad("log-level", fmt.Errorf("%q is not one of debug|info|warn|error", f.level))
	}
	if f.o.logFormat != "text" && f.o.logFormat != "json" {
		return bad("log-format", fmt.Errorf("%q is not one of text|json", f.o.logFormat))
	}
	return nil
}

// splitList splits a comma-separated list, dropping blanks around the
// items and empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
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
