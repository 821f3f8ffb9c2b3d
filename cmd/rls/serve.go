package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/rlsproject/rls/internal/authz"
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/configwatch"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tlsfiles"
)

// hooks are what tests change in a serving process; the zero value is the
// real thing.
type hooks struct {
	// now is the memory store's clock (nil: time.Now).
	now func() time.Time
	// storeTimeout, when positive, replaces the options' store timeout:
	// for tests of compatibility mode, whose environment has no such
	// setting, and whose exact counts a loaded machine must not make miss
	// the 10 ms default.
	storeTimeout time.Duration
}

func newLogger(o *options, w io.Writer) *slog.Logger {
	hopts := &slog.HandlerOptions{Level: o.logLevel}
	if o.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, hopts))
	}
	return slog.New(slog.NewTextHandler(w, hopts))
}

// serve runs the server until ctx is done (SIGTERM/SIGINT), then drains.
func serve(ctx context.Context, args, env []string, stdout, stderr io.Writer, h hooks) error {
	o, err := parseServeFlags(args, env, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if h.storeTimeout > 0 {
		o.storeTimeout = h.storeTimeout
	}
	log := newLogger(o, stderr)
	// SIGHUP reloads. Caught from the start: its default action would end
	// the process if it came while the listeners start.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tuneGC(o, env, log)

	d, err := start(ctx, o, log, h)
	if err != nil {
		return err
	}
	defer d.close()
	serveErr := d.loop(ctx, hup)
	d.drain()
	return serveErr
}

// tuneGC sets the collector for the heap o bounds, leaving what the
// environment's GOGC and GOMEMLIMIT set.
func tuneGC(o *options, env []string, log *slog.Logger) {
	heapBound := int64(0)
	if o.store == "memory" {
		heapBound = o.memoryLimit
	}
	set := func(name string) bool {
		return slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
	}
	if gogc, limit := grpcserver.TuneGC(heapBound, grpcserver.EnvGC{GOGC: set("GOGC"), GOMEMLIMIT: set("GOMEMLIMIT")}); gogc != 0 || limit != 0 {
		log.Debug("garbage collector tuned", "gogc", gogc, "memory_limit", limit)
	}
}

// daemon is a started server: the service, its store and both listeners'
// servers, serving. Its methods are called by serve, in order: loop, drain,
// close.
type daemon struct {
	o          *options
	log        *slog.Logger
	svc        *service.Service
	closeStore func()
	grpc       *grpc.Server
	health     *health.Server
	http       *httpapi.Server
	// loaded is the fingerprint of the config files taken before the first
	// load, so that the watch reports a change made while rls started.
	loaded [32]byte
	// errc receives the error of a listener's server that stops serving.
	errc chan error
	// stop ends the goroutines that start started (readiness, watch); done
	// is closed when they have returned.
	stop context.CancelFunc
	done chan struct{}
	// draining is set when the shutdown starts (/healthcheck then says 500).
	draining atomic.Bool
	// extraStop stops what compatibility mode started (compat_serve.go).
	extraStop []func()
}

// start loads the config, builds the store and the service, and serves
// both listeners. On error what it started is stopped.
func start(ctx context.Context, o *options, log *slog.Logger, h hooks) (d *daemon, err error) {
	loaded := configwatch.Fingerprint(o.config, o.configLimits)
	cfg, err := initialConfig(o, log)
	if err != nil {
		return nil, err
	}
	d = &daemon{o: o, log: log, loaded: loaded, errc: make(chan error, 2), done: make(chan struct{})}
	var undo []func()
	defer func() {
		if err != nil {
			for _, f := range slices.Backward(undo) {
				f()
			}
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	store, closeStore, err := newStore(ctx, o, reg, log, h)
	if err != nil {
		return nil, err
	}
	d.closeStore = closeStore
	undo = append(undo, closeStore)
	sopts := service.Options{
		Store:           store,
		StoreDoesIO:     o.store == "redis",
		OnStoreError:    o.onStoreError,
		Headers:         o.responseHeaders,
		Registry:        reg,
		MaxValueSeries:  o.maxValueSeries,
		Logger:          log,
		CountDeniedHits: o.countDeniedHits,
	}
	o.reference.plug(&sopts, reg)
	d.svc = service.New(sopts)
	if cfg != nil {
		d.svc.Reload(func() (*config.Config, error) { return cfg, nil })
	}

	grpcLis, err := net.Listen("tcp", o.grpcAddr)
	if err != nil {
		return nil, fmt.Errorf("--grpc-addr: %w", err)
	}
	undo = append(undo, func() { grpcLis.Close() })
	httpLis, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return nil, fmt.Errorf("--http-addr: %w", err)
	}
	undo = append(undo, func() { httpLis.Close() })
	var tlsSource *tlsfiles.Source
	if o.tls.Cert != "" {
		if tlsSource, err = tlsfiles.New(o.tls, log); err != nil {
			return nil, err
		}
	}

	rls := envoyrls.New(d.svc)
	d.grpc, d.health = newGRPCServer(o, d.svc, rls, tlsSource)
	d.http = newHTTPServer(o, d.svc, rls, reg, log, d.withHealthcheck)
	if err := d.startCompat(ctx, reg, store); err != nil {
		return nil, err
	}
	go func() { d.errc <- d.grpc.Serve(grpcLis) }()
	go func() {
		if o.tlsHTTP {
			d.errc <- d.http.ServeTLS(httpLis, tlsSource.Config())
			return
		}
		d.errc <- d.http.Serve(httpLis)
	}()
	log.Info("serving", "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(), "tls_grpc", o.tlsGRPC, "tls_http", o.tlsHTTP,
		"http_max_connections", o.httpLimits.MaxConnections, "grpc_max_streams", o.grpcLimits.MaxStreams,
		"store", o.store, "config", o.config, "domains", len(cfg.Domains()))
	return d, nil
}

// newGRPCServer returns the gRPC server with every service registered, and
// its health server.
func newGRPCServer(o *options, svc *service.Service, rls *envoyrls.Server, tlsSource *tlsfiles.Source) (*grpc.Server, *health.Server) {
	// rls's codec: descriptor values need not be UTF-8 (Envoy copies header bytes)
	gopts := append(grpcserver.Options(o.grpcLimits), envoyrls.ServerCodec())
	if o.tlsGRPC {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(o.compat.grpcServerTLS(tlsSource.Config()))))
	}
	gs := grpc.NewServer(gopts...)
	rls.Register(gs)
	authz.New(svc, o.trustedProxies).Register(gs)
	hs := health.NewServer()
	// Not serving until followReadiness has asked the service (its first
	// question may wait for a store that does not answer); grpc-go's
	// default would say SERVING meanwhile.
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs, hs
}

// newHTTPServer returns the HTTP server of the HTTP listener.
func newHTTPServer(o *options, svc *service.Service, rls *envoyrls.Server, reg *prometheus.Registry, log *slog.Logger, wrap func(http.Handler) http.Handler) *httpapi.Server {
	h := wrap(httpapi.New(httpapi.Options{
		Service:  svc,
		JSON:     rls.JSON(),
		Gatherer: reg,
		Debug:    o.debug,
		Auth:     httpapi.AuthOptions{TrustedProxies: o.trustedProxies},
		Logger:   log,
	}))
	return httpapi.NewServer(h, o.httpLimits, log, reg)
}

// loop keeps the gRPC health status equal to readiness and reloads the
// config on SIGHUP and (with --watch) when its files change, until ctx is
// done or a listener's server fails.
func (d *daemon) loop(ctx context.Context, hup <-chan os.Signal) error {
	bg, stop := context.WithCancel(ctx)
	d.stop = stop
	changed := make(chan struct{}, 1)
	go func() {
		defer close(d.done)
		followReadiness(bg, d.svc, d.health, 2*time.Second)
	}()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if d.o.watch {
			d.watch(bg, changed)
		}
	}()
	defer func() { stop(); <-watchDone }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			if d.o.compat != nil && d.o.compat.xds != nil {
				d.log.Info("SIGHUP: the config comes from xDS; nothing to reload")
				continue
			}
			d.log.Info("SIGHUP: reloading config")
			d.svc.Reload(d.load)
		case <-changed:
			d.log.Info("config files changed: reloading")
			d.svc.Reload(d.load)
		case err := <-d.errc:
			return fmt.Errorf("serving: %w", err)
		}
	}
}

func (d *daemon) load() (*config.Config, error) {
	return config.LoadWith(d.o.configLimits, d.o.config)
}

// watch signals changed (without blocking) when the config's files change,
// until ctx is done.
func (d *daemon) watch(ctx context.Context, changed chan<- struct{}) {
	err := configwatch.Watch(ctx, d.o.config, configwatch.Options{Limits: d.o.configLimits, Log: d.log, Loaded: &d.loaded}, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		d.log.Warn("not watching the config; SIGHUP still reloads it", "error", err)
	}
}

// drain stops taking new work, finishes what is in flight within
// --shutdown-timeout, then stops both servers.
func (d *daemon) drain() {
	d.log.Info("shutting down", "timeout", d.o.shutdownTimeout)
	d.draining.Store(true)
	d.health.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), d.o.shutdownTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		d.grpc.GracefulStop()
		close(stopped)
	}()
	if err := d.http.Shutdown(sctx); err != nil {
		d.log.Warn("HTTP shutdown", "error", err)
	}
	select {
	case <-stopped:
	case <-sctx.Done():
		d.log.Warn("gRPC drain timed out; closing the remaining connections")
		d.grpc.Stop()
		<-stopped
	}
	d.log.Info("stopped")
}

// close releases the store once the servers are stopped, and waits for the
// readiness goroutine.
func (d *daemon) close() {
	if d.stop != nil {
		d.stop()
		<-d.done
	}
	d.stopCompat()
	d.closeStore()
}

// newStore builds the store of o, registers its metrics on reg and returns
// a function that closes it.
func newStore(ctx context.Context, o *options, reg prometheus.Registerer, log *slog.Logger, h hooks) (engine.Store, func(), error) {
	if o.store == "memory" {
		s := memstore.New(memstore.Options{MaxBytes: o.memoryLimit, Now: h.now})
		reg.MustRegister(s.Collectors()...)
		return s, func() { s.Close() }, nil
	}
	// go-redis logs through a logger of its own (process-wide): send it to
	// ours, at a bounded rate, so that a Redis outage does not flood stderr.
	redis.SetLogger(&redisLogger{log: log, every: rate.Sometimes{Interval: 10 * time.Second}})
	opts := redisstore.Options{
		URL:           o.redisURL,
		ClusterSeeds:  o.redisCluster,
		CAFile:        o.redisCA,
		CertFile:      o.redisCert,
		KeyFile:       o.redisKey,
		Prefix:        o.redisPrefix,
		PoolSize:      o.redisPoolSize,
		Timeout:       o.storeTimeout,
		DenyCache:     o.denyCache,
		DenyCacheSize: o.compat.denyCacheSizeOf(),
		Logger:        log,

		Sentinel:        o.redisSentinel,
		TLSSkipHostname: o.redisTLSSkipHostname,
	}
	if t := o.redisPerSecond; t != nil {
		opts.PerSecond = &redisstore.Options{URL: t.url, ClusterSeeds: t.cluster, Sentinel: t.sentinel,
			CAFile: t.ca, CertFile: t.cert, KeyFile: t.key, TLSSkipHostname: t.skipHostname, PoolSize: t.poolSize}
	}
	s, err := redisstore.New(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("--store=redis: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.Warm(pctx); err != nil {
		// Serve anyway: /readyz says not ready, --on-store-error decides what
		// requests get, and the store reconnects by itself.
		log.Warn("Redis does not answer yet", "error", err)
	}
	reg.MustRegister(s.Collectors()...)
	return s, func() { s.Close() }, nil
}

// redisLogger adapts go-redis's logging to slog.
type redisLogger struct {
	log   *slog.Logger
	every rate.Sometimes
}

func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.every.Do(func() { l.log.Warn("redis client: " + fmt.Sprintf(format, v...)) })
}

// followReadiness keeps the gRPC health status (overall and per service)
// equal to the service's readiness: NOT_SERVING while the store does not
// answer, so that a gRPC health check sees what /readyz sees.
func followReadiness(ctx context.Context, svc *service.Service, hs *health.Server, every time.Duration) {
	// "ratelimit": the name envoyproxy/ratelimit's health follows, which its
	// probes and clients ask for.
	services := []string{"", "envoy.service.ratelimit.v3.RateLimitService", "envoy.service.auth.v3.Authorization", "ratelimit"}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, every/2)
		status := healthpb.HealthCheckResponse_SERVING
		if svc.Ready(pctx) != nil {
			status = healthpb.HealthCheckResponse_NOT_SERVING
		}
		cancel()
		for _, name := range services {
			hs.SetServingStatus(name, status)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
