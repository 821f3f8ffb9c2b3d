package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/memstore"
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
}

// usageError is a bad command line; it exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// errSilent ends the program with exit code 1 after its output said why.
var errSilent = errors.New("")

func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

// parseServeFlags parses args, falling back to RLS_<FLAG> variables of env
// for flags not given on the command line.
func parseServeFlags(args, env []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("rls serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o                                                          options
		cluster, onErr, headers, debug, proxies, level, mem, tlsOn string
	)
	fs.StringVar(&o.config, "config", "config/limits.yaml", "a YAML `file`, or a directory whose *.yaml/*.yml files are all loaded")
	fs.StringVar(&o.grpcAddr, "grpc-addr", ":8081", "gRPC listen `address` (RateLimitService, Authorization, health, reflection)")
	fs.StringVar(&o.httpAddr, "http-addr", ":8080", "HTTP listen `address` (/healthz, /readyz, /metrics, /json, /auth/{domain}, /debug)")
	fs.StringVar(&o.store, "store", "memory", "counter store: memory (embedded, one process) or redis")
	fs.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis `URL`: redis:// or rediss:// (TLS), user and password in the URL")
	fs.StringVar(&cluster, "redis-cluster", "", "comma-separated `host:port` seeds; when set, Redis Cluster mode")
	fs.StringVar(&o.redisPrefix, "redis-prefix", "rls:", "prefix of every Redis key")
	fs.StringVar(&o.redisCA, "redis-ca", "", "PEM `file` of the CA that signs Redis's certificate (rediss:// with a private CA)")
	fs.IntVar(&o.redisPoolSize, "redis-pool-size", 0, "Redis connections per node (0: 10 per CPU)")
	fs.DurationVar(&o.storeTimeout, "store-timeout", 10*time.Millisecond, "bound on one store call")
	fs.StringVar(&onErr, "on-store-error", "error", "when the store fails: error (gRPC UNAVAILABLE / HTTP 503), allow (OK) or deny (OVER_LIMIT)")
	fs.StringVar(&headers, "response-headers", "off", "rate-limit headers in RateLimitService responses: off, draft03 (X-RateLimit-*), draft11 (RateLimit, RateLimit-Policy) or both")
	fs.StringVar(&mem, "memory-limit", "256MiB", "memory bound of the memory store's counters (bytes, or with KiB/MiB/GiB)")
	fs.BoolVar(&o.denyCache, "deny-cache", true, "answer requests that Redis said are denied until an exact instant from memory until then")
	fs.StringVar(&debug, "debug-endpoints", "loopback", "who may use /debug/config and /debug/pprof: loopback, on or off")
	fs.StringVar(&proxies, "trusted-proxies", "", "comma-separated CIDRs whose X-Forwarded-For /auth believes (empty: trust X-Real-IP / X-Forwarded-For from any peer)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long SIGTERM waits for in-flight requests")
	fs.BoolVar(&o.watch, "watch", true, "reload the config when its files change (SIGHUP always reloads)")
	fs.StringVar(&o.tls.Cert, "tls-cert", "", "PEM certificate `file`: serve TLS (re-read when it changes)")
	fs.StringVar(&o.tls.Key, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.StringVar(&o.tls.ClientCA, "tls-client-ca", "", "PEM CA `file`: require client certificates signed by it (mutual TLS)")
	fs.StringVar(&tlsOn, "tls-listeners", "grpc,http", "which listeners --tls-cert applies to: grpc, http or grpc,http")
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	fromEnv, err := applyEnv(fs, env)
	if err != nil {
		return nil, usageError{err}
	}

	bad := func(name string, e error) error {
		if fromEnv[name] {
			return usageError{fmt.Errorf("%s (--%s): %w", EnvName(name), name, e)}
		}
		return usageError{fmt.Errorf("--%s: %w", name, e)}
	}
	if o.store != "memory" && o.store != "redis" {
		return nil, bad("store", fmt.Errorf("%q is not one of memory|redis", o.store))
	}
	if cluster != "" {
		for _, s := range strings.Split(cluster, ",") {
			if s = strings.TrimSpace(s); s != "" {
				o.redisCluster = append(o.redisCluster, s)
			}
		}
	}
	if o.storeTimeout <= 0 {
		return nil, bad("store-timeout", fmt.Errorf("%s is not positive", o.storeTimeout))
	}
	if o.onStoreError, err = service.ParseStoreErrorPolicy(onErr); err != nil {
		return nil, bad("on-store-error", err)
	}
	if o.responseHeaders, err = service.ParseHeaderMode(headers); err != nil {
		return nil, bad("response-headers", err)
	}
	if o.memoryLimit, err = parseBytes(mem); err != nil {
		return nil, bad("memory-limit", err)
	}
	if o.memoryLimit < memstore.MinMaxBytes {
		return nil, bad("memory-limit", fmt.Errorf("%s is less than the minimum of %d bytes", mem, memstore.MinMaxBytes))
	}
	if o.debug, err = httpapi.ParseDebugAccess(debug); err != nil {
		return nil, bad("debug-endpoints", err)
	}
	if proxies != "" {
		for _, s := range strings.Split(proxies, ",") {
			p, err := parsePrefix(strings.TrimSpace(s))
			if err != nil {
				return nil, bad("trusted-proxies", err)
			}
			o.trustedProxies = append(o.trustedProxies, p)
		}
	}
	if (o.tls.Cert == "") != (o.tls.Key == "") {
		return nil, bad("tls-cert", errors.New("--tls-cert and --tls-key go together"))
	}
	if o.tls.ClientCA != "" && o.tls.Cert == "" {
		return nil, bad("tls-client-ca", errors.New("needs --tls-cert and --tls-key"))
	}
	if o.tls.Cert != "" {
		for _, l := range strings.Split(tlsOn, ",") {
			switch strings.TrimSpace(l) {
			case "grpc":
				o.tlsGRPC = true
			case "http":
				o.tlsHTTP = true
			default:
				return nil, bad("tls-listeners", fmt.Errorf("%q is not grpc or http", l))
			}
		}
	}
	if err := o.logLevel.UnmarshalText([]byte(level)); err != nil {
		return nil, bad("log-level", fmt.Errorf("%q is not one of debug|info|warn|error", level))
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return nil, bad("log-format", fmt.Errorf("%q is not one of text|json", o.logFormat))
	}
	return &o, nil
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
		name := EnvName(f.Name)
		if v := vars[name]; v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
			fromEnv[f.Name] = true
		}
	})
	return fromEnv, err
}

// EnvName returns the environment variable of a flag: RLS_ + upper case,
// '-' → '_'.
func EnvName(flag string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
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
