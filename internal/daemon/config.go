package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionlog"
	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tlsfiles"
	"github.com/rlsproject/rls/internal/topkeys"
	"github.com/rlsproject/rls/internal/tracing"
)

// Config is a server's whole configuration: sections that each part of the
// server takes whole, and what a front end plugs in. A front end starts
// from Defaults and sets what its settings say, checking each value as it
// reads it; New takes the Config as it is. The zero Config is not a
// working one: start from Defaults. A Config holds no running thing (its
// plug-ins' Source aside, which one server uses): one Config may start
// servers one after the other.
type Config struct {
	Listeners Listeners
	Store     Store
	Service   Service
	// Files is rls's own config source: the files under a path. A
	// Plugins.Source replaces it; Files.Path is still what the start's log
	// line calls the config.
	Files   Files
	Logging Logging
	// Tracing says whether and where spans are exported (OTLP); the zero
	// value is tracing off.
	Tracing tracing.Config
	// TopKeys keeps the top keys of every limit (GET /debug/top); its K 0
	// turns them off.
	TopKeys TopKeys
	// DecisionLog writes a record per decision when its Path is set; its
	// Now and Logger are the server's.
	DecisionLog decisionlog.Options
	// Names name the front end's settings in New's errors.
	Names   Names
	Plugins Plugins
}

// Listeners are the gRPC and HTTP listeners and the bounds on their
// clients.
type Listeners struct {
	// GRPCAddr serves RateLimitService, ext_authz (Authorization), gRPC
	// health and reflection; HTTPAddr serves the HTTP API (/json, /auth,
	// /healthz, /readyz, /metrics, /debug/) and /healthcheck.
	GRPCAddr, HTTPAddr string
	// TLS, when TLS.Files.Cert is set, serves TLS on the listeners it
	// names.
	TLS TLS
	// TrustedProxies are the proxies whose X-Forwarded-For /auth and
	// ext_authz believe.
	TrustedProxies []netip.Prefix
	// Debug says who may use /debug/.
	Debug httpapi.DebugAccess
	// AdminTokenFile, when set, is a file whose bearer token lets clients
	// off loopback use /admin/ (--admin-token-file), read again every
	// second.
	AdminTokenFile string
	// AdminRequireToken makes /admin/ and /debug/ want that token from
	// loopback clients too (--admin-require-token); without
	// AdminTokenFile they then refuse everyone.
	AdminRequireToken bool
	// UI serves the operator page at /ui/ on the HTTP listener (--ui):
	// its views as /debug/, its actions as /admin/.
	UI bool
	// HTTP bounds the HTTP listener's clients. HTTP.MaxConnections 0
	// means half the process's open-file limit (RLIMIT_NOFILE), at least
	// 16 and at most 10,000, leaving the rest to gRPC and Redis.
	HTTP httpapi.Limits
	// GRPC bounds the gRPC listener's clients.
	GRPC grpcserver.Limits
	// ShutdownTimeout is how long a shutdown waits for requests in flight
	// before it closes the connections that are left.
	ShutdownTimeout time.Duration
}

// TLS is the TLS of the listeners.
type TLS struct {
	// Files are the certificate, its key and the CA of client
	// certificates (required when set), re-read when they change. No
	// Cert: no TLS.
	Files tlsfiles.Files
	// GRPC and HTTP say which listeners serve TLS (when Files.Cert is
	// set).
	GRPC, HTTP bool
}

// StoreKind is where counters live.
type StoreKind string

// The store kinds.
const (
	// Memory is the embedded store: one process.
	Memory StoreKind = "memory"
	// Redis is the Redis store, shared by every rls on it.
	Redis StoreKind = "redis"
)

// Store is the counter store.
type Store struct {
	Kind StoreKind
	// Memory configures the memory store. Memory.Now is the store's
	// clock, an injected dependency: nil is time.Now, the production
	// default; a test gives a clock it moves itself.
	Memory memstore.Options
	// Redis configures the Redis store (Redis.Timeout bounds one store
	// call); its Logger is the server's.
	Redis redisstore.Options
	// OverridesFile, with the memory store, is a file that keeps the
	// runtime overrides (/admin/overrides) across restarts (--overrides-
	// file); "" keeps them in memory only. On Redis they are kept in
	// Redis, beside the counters.
	OverridesFile string
}

// Service is the service's policies.
type Service struct {
	// OnStoreError is what a request gets when the store fails or times
	// out.
	OnStoreError service.StoreErrorPolicy
	// Headers selects the rate-limit headers of RateLimitService answers.
	Headers service.HeaderMode
	// CountDeniedHits makes every limit count the hits of a denied
	// request.
	CountDeniedHits bool
	// QuotaAll treats every descriptor as a quota_mode one.
	QuotaAll bool
	// ShadowAll puts every limit in shadow mode (--shadow).
	ShadowAll bool
	// MaxValueSeries bounds the per-value series of one limit.
	MaxValueSeries int
}

// TopKeys are the top keys of every limit (internal/topkeys).
type TopKeys struct {
	// K is the keys kept per limit and ranking; 0 turns top keys off.
	K int
	// Publish is how often a process on a Redis store publishes its
	// summary to the others (0: topkeys.DefaultEvery).
	Publish time.Duration
}

// Files is rls's own config source: a YAML file, or a directory whose
// YAML files are all loaded.
type Files struct {
	Path string
	// Watch reloads the config when its files change (Server.Reload
	// always does).
	Watch bool
	// Limits bound what one load reads, and say how it parses.
	Limits config.LoadOptions
}

// Logging is what the server logs and how.
type Logging struct {
	// Level is the least level logged.
	Level slog.Level
	// Format is "text" or "json".
	Format string
}

// Logger returns a logger that writes to w as l says.
func (l Logging) Logger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.Level}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Names are the names of the front end's settings that gave the listeners'
// addresses and the Redis store's settings, as New's errors call them
// ("--grpc-addr: listen tcp ..."). An empty name is "gRPC listener", "HTTP
// listener" or "Redis store".
type Names struct {
	GRPCAddr, HTTPAddr, Redis string
}

func (n Names) grpcAddr() string { return orDefault(n.GRPCAddr, "gRPC listener") }
func (n Names) httpAddr() string { return orDefault(n.HTTPAddr, "HTTP listener") }
func (n Names) redis() string    { return orDefault(n.Redis, "Redis store") }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Plugins are what a front end adds to rls's own server. The zero value
// adds nothing.
//
// /healthcheck (on the HTTP listener, in every mode) answers 200 while a
// config is loaded and the server is not shutting down, and 500 otherwise:
// it follows the config source (a Source's Initial config, or none until it
// brings one), not the store, so that a store outage does not make an
// orchestrator restart every replica.
type Plugins struct {
	// Start, when set, is called once at start, when the store and the
	// metrics registry exist and before the service is made: it returns
	// the service's observers and answer rules, and may register metrics
	// of its own and log what the front end has to say. An error stops the
	// start.
	Start func(Parts) (Hooks, error)
	// Source, when set, is where the config comes from instead of Files.
	Source Source
	// Listeners are served beside the gRPC and HTTP listeners, started
	// and stopped with them.
	Listeners []Listener
	// GRPCTLS, when set, changes the gRPC listener's TLS config (when it
	// serves TLS): what it returns is used instead. It is called once, at
	// start.
	GRPCTLS func(*tls.Config) *tls.Config
}

// Parts are the parts of a starting server that Plugins.Start may use.
type Parts struct {
	Store engine.Store
	// Redis is what front ends may read of a Redis store (zero for the
	// memory store).
	Redis RedisParts
	// Service is the service's policies (Config.Service).
	Service Service
	// Registry is the registry that /metrics serves.
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// Hooks are the service's hooks that a front end fills
// (internal/service/hooks.go), and the work it runs beside the server.
type Hooks struct {
	Observers   []service.Observer
	AnswerRules []service.AnswerRule
	// Tasks run from Server.Run until the server has drained (its
	// listeners stopped, no decision left in flight): then their context
	// ends and Run waits for them to return. A task that has work left at
	// its end (a last flush of stats) does it then, bounded in time.
	Tasks []func(ctx context.Context)
}

// Listener is an extra HTTP listener.
type Listener struct {
	// Name names the listener in errors and logs: the setting that gives
	// its address.
	Name string
	Addr string
	// Handler returns what the listener serves, given the server's
	// service and its metrics (what /metrics serves).
	Handler func(svc *service.Service, metrics prometheus.Gatherer) http.Handler
}

// MaxExtraConnections bounds the open connections of each extra listener:
// their clients are a few scrapers and operators, and a flood there must
// not take the file descriptors that the HTTP and gRPC listeners need.
const MaxExtraConnections = 64

// Defaults returns rls's defaults: what `rls serve` does with no flags.
func Defaults() Config {
	return Config{
		Listeners: Listeners{
			GRPCAddr: ":8081",
			HTTPAddr: ":8080",
			Debug:    httpapi.DebugLoopback,
			HTTP: httpapi.Limits{
				ReadHeaderTimeout: httpapi.DefaultReadTimeout,
				ReadTimeout:       httpapi.DefaultReadTimeout,
				WriteTimeout:      httpapi.DefaultWriteTimeout,
				IdleTimeout:       httpapi.DefaultIdleTimeout,
			},
			GRPC: grpcserver.Limits{
				MaxStreams:            grpcserver.DefaultMaxStreams,
				MaxConnectionAge:      grpcserver.DefaultMaxConnectionAge,
				MaxConnectionAgeGrace: grpcserver.DefaultMaxConnectionAgeGrace,
			},
			ShutdownTimeout: 15 * time.Second,
		},
		Store: Store{
			Kind:   Memory,
			Memory: memstore.Options{MaxBytes: memstore.DefaultMaxBytes},
			Redis: redisstore.Options{
				URL:       "redis://127.0.0.1:6379/0",
				Prefix:    "rls:",
				Timeout:   10 * time.Millisecond,
				DenyCache: true,
			},
		},
		Service: Service{
			OnStoreError:   service.FailError,
			Headers:        service.HeadersOff,
			MaxValueSeries: decisionmetrics.DefaultMaxValueSeries,
		},
		Files: Files{
			Path:   "config/limits.yaml",
			Watch:  true,
			Limits: config.LoadOptions{}.WithDefaults(),
		},
		Logging: Logging{Level: slog.LevelInfo, Format: "text"},
		TopKeys: TopKeys{K: topkeys.DefaultK, Publish: topkeys.DefaultEvery},
		DecisionLog: decisionlog.Options{Sample: 1, MaxBytes: decisionlog.DefaultMaxBytes, Backups: decisionlog.DefaultBackups,
			Queue: decisionlog.DefaultQueue},
	}
}

// SplitList splits a comma-separated list of settings (a cluster's seeds,
// a Sentinel's master and sentinels), dropping blanks around the items and
// empty items.
func SplitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// ParseSentinel reads a master watched by Redis Sentinel as rls's
// --redis-sentinel and envoyproxy/ratelimit's REDIS_URL give it: its name,
// then its sentinels' addresses (master,host:port,host:port).
func ParseSentinel(spec string) (*redisstore.Sentinel, error) {
	parts := SplitList(spec)
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
