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
	"github.com/rlsproject/rls/internal/configwatch"
	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tlsfiles"
)

func newLogger(o *options, w io.Writer) *slog.Logger {
	hopts := &slog.HandlerOptions{Level: o.logLevel}
	if o.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, hopts))
	}
	return slog.New(slog.NewTextHandler(w, hopts))
}

// serve runs the server until ctx is done (SIGTERM/SIGINT), then drains.
func serve(ctx context.Context, args, env []string, stdout, stderr io.Writer) error {
	o, err := parseServeFlags(args, env, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log := newLogger(o, stderr)
	// SIGHUP reloads. Caught from the start: its default action would end
	// the process if it came while the listeners start.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	heapBound := int64(0)
	if o.store == "memory" {
		heapBound = o.memoryLimit
	}
	if gogc, limit := grpcserver.TuneGC(heapBound); gogc != 0 || limit != 0 {
		log.Debug("garbage collector tuned", "gogc", gogc, "memory_limit", limit)
	}

	load := func() (*descriptors.Config, error) { return descriptors.Load(o.config) }
	cfg, err := load()
	if err != nil {
		return fmt.Errorf("loading config %s:\n%w", o.config, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	store, closeStore, err := newStore(ctx, o, reg, log)
	if err != nil {
		return err
	}
	defer closeStore()

	svc := service.New(service.Options{
		Store:        store,
		TimeStore:    o.store == "redis",
		OnStoreError: o.onStoreError,
		Headers:      o.responseHeaders,
		Registry:     reg,
		Logger:       log,
	})
	svc.Reload(func() (*descriptors.Config, error) { return cfg, nil })

	grpcLis, err := net.Listen("tcp", o.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	defer grpcLis.Close()
	httpLis, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return fmt.Errorf("--http-addr: %w", err)
	}
	defer httpLis.Close()

	var tlsSource *tlsfiles.Source
	if o.tls.Cert != "" {
		if tlsSource, err = tlsfiles.New(o.tls, log); err != nil {
			return err
		}
	}
	// rls's codec: descriptor values need not be UTF-8 (Envoy copies header bytes)
	gopts := append(grpcserver.Options(), envoyrls.ServerCodec())
	if o.tlsGRPC {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsSource.Config())))
	}
	gs := grpc.NewServer(gopts...)
	rls := envoyrls.New(svc)
	rls.Register(gs)
	authz.New(svc, o.trustedProxies).Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	healthCtx, stopHealth := context.WithCancel(ctx)
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		followReadiness(healthCtx, svc, hs, 2*time.Second)
	}()
	defer func() { stopHealth(); <-healthDone }()

	httpSrv := &http.Server{
		Handler: httpapi.New(httpapi.Options{
			Service:     svc,
			RateLimiter: rls,
			Gatherer:    reg,
			Debug:       o.debug,
			Auth:        httpapi.AuthOptions{TrustedProxies: o.trustedProxies},
			Logger:      log,
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}

	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(grpcLis) }()
	go func() {
		if o.tlsHTTP {
			httpSrv.TLSConfig = tlsSource.Config()
			errc <- httpSrv.ServeTLS(httpLis, "", "")
			return
		}
		errc <- httpSrv.Serve(httpLis)
	}()
	log.Info("serving", "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(), "tls_grpc", o.tlsGRPC, "tls_http", o.tlsHTTP,
		"store", o.store, "config", o.config, "domains", len(cfg.Domains()))

	changed := make(chan struct{}, 1)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := make(chan struct{})
	if o.watch {
		go func() {
			defer close(watchDone)
			err := configwatch.Watch(watchCtx, o.config, 250*time.Millisecond, log, func() {
				select {
				case changed <- struct{}{}:
				default:
				}
			})
			if err != nil {
				log.Warn("not watching the config; SIGHUP still reloads it", "error", err)
			}
		}()
	} else {
		close(watchDone)
	}
	defer func() { stopWatch(); <-watchDone }()

	var serveErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-hup:
			log.Info("SIGHUP: reloading config")
			svc.Reload(load)
		case <-changed:
			log.Info("config files changed: reloading")
			svc.Reload(load)
		case err := <-errc:
			serveErr = fmt.Errorf("serving: %w", err)
			break loop
		}
	}

	// Drain: stop taking new work, finish what is in flight, then stop.
	log.Info("shutting down", "timeout", o.shutdownTimeout)
	hs.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	if err := httpSrv.Shutdown(sctx); err != nil {
		log.Warn("HTTP shutdown", "error", err)
	}
	select {
	case <-stopped:
	case <-sctx.Done():
		log.Warn("gRPC drain timed out; closing the remaining connections")
		gs.Stop()
		<-stopped
	}
	log.Info("stopped")
	return serveErr
}

// newStore builds the store of o and a function that closes it.
func newStore(ctx context.Context, o *options, reg prometheus.Registerer, log *slog.Logger) (engine.Store, func(), error) {
	switch o.store {
	case "memory":
		s := memstore.New(memstore.Options{MaxBytes: o.memoryLimit})
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_memstore_counters",
			Help: "Counters held by the memory store.",
		}, func() float64 { n, _ := s.Stats(); return float64(n) }))
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_memstore_bytes",
			Help: "Bytes the memory store's counters are counted as taking (bounded by --memory-limit).",
		}, func() float64 { _, b := s.Stats(); return float64(b) }))
		return s, func() { s.Close() }, nil
	}
	// go-redis logs through a logger of its own (process-wide): send it to
	// ours, at a bounded rate, so that a Redis outage does not flood stderr.
	redis.SetLogger(&redisLogger{log: log, every: rate.Sometimes{Interval: 10 * time.Second}})
	s, err := redisstore.New(redisstore.Options{
		URL:          o.redisURL,
		ClusterSeeds: o.redisCluster,
		CAFile:       o.redisCA,
		Prefix:       o.redisPrefix,
		PoolSize:     o.redisPoolSize,
		Timeout:      o.storeTimeout,
		DenyCache:    o.denyCache,
		Logger:       log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("--store=redis: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.Ping(pctx); err != nil {
		// Serve anyway: /readyz says not ready, --on-store-error decides what
		// requests get, and the store reconnects by itself.
		log.Warn("Redis does not answer yet", "error", err)
	}
	counter := func(name, help string, f func(redisstore.Stats) uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(s.Stats())) }))
	}
	counter("rls_redis_decisions_total", "Requests decided by Redis scripts.", func(st redisstore.Stats) uint64 { return st.Decisions })
	counter("rls_redis_scripts_total", "Scripts sent to Redis (EVALSHA, or EVAL after NOSCRIPT).", func(st redisstore.Stats) uint64 { return st.Scripts })
	counter("rls_redis_round_trips_total", "Pipelines sent to Redis; decisions/round trips is the batching.", func(st redisstore.Stats) uint64 { return st.RoundTrips })
	counter("rls_deny_cache_hits_total", "Requests denied from the denial cache without a round trip.", func(st redisstore.Stats) uint64 { return st.CacheHits })
	counter("rls_redis_releases_total", "Cluster reservations released because another node denied the request.", func(st redisstore.Stats) uint64 { return st.Releases })
	counter("rls_redis_errors_total", "Store calls that failed.", func(st redisstore.Stats) uint64 { return st.Errors })
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
	services := []string{"", "envoy.service.ratelimit.v3.RateLimitService", "envoy.service.auth.v3.Authorization"}
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
