package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/redisconn"
	"github.com/rlsproject/rls/internal/reloadlog"
	"github.com/rlsproject/rls/internal/rlqs"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tlsfiles"
	"github.com/rlsproject/rls/internal/tracing"
)

// Server is a started server: its store, its service and its listeners,
// serving. New starts it; Run serves until its context ends, then drains
// and releases everything. Reload is safe for concurrent use; Run is
// called once.
type Server struct {
	cfg        Config
	log        *slog.Logger
	reg        *prometheus.Registry
	svc        *service.Service
	source     Source
	closeStore func()
	overrides  *overrides.Keeper
	loads      *reloadlog.Log                                   // the last config loads, for /debug/status
	storeNodes func(ctx context.Context) []redisconn.NodeHealth // nil off Redis
	tracing    *tracing.Provider                                // nil: tracing off
	grpc       *grpc.Server
	health     *health.Server
	http       *httpapi.Server
	adminToken *httpapi.TokenFile // nil: admin endpoints for loopback only
	insight    *insight           // the top keys and the decision log
	grpcAddr   net.Addr
	httpAddr   net.Addr
	extras     []*extraServer
	tasks      []func(context.Context) // Hooks.Tasks
	// errc receives the error of a listener's server that stops serving.
	errc chan error
	// asked carries the reloads asked for (Reload) to the source.
	asked chan string
	// draining is set when the shutdown starts (/healthcheck then says 500).
	draining atomic.Bool
}

// New loads the initial config, builds the store and the service, and
// serves the listeners of cfg (and of its plug-ins); ctx bounds the start
// (the store's first connection), log receives what the server logs (nil:
// nothing). On error what it started is stopped. The server serves until
// Run, which must follow, returns: Run is what releases it.
func New(ctx context.Context, cfg Config, log *slog.Logger) (_ *Server, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Listeners.HTTP.MaxConnections == 0 {
		cfg.Listeners.HTTP.MaxConnections = httpConnectionShare(openFileLimit())
	}
	s := &Server{cfg: cfg, log: log, source: cfg.Plugins.Source, errc: make(chan error, 2), asked: make(chan string, 1)}
	if s.source == nil {
		s.source = NewFileSource(cfg.Files)
	}
	initial, err := s.source.Initial(log)
	if err != nil {
		return nil, err
	}
	var undo []func()
	defer func() {
		if err != nil {
			for _, f := range slices.Backward(undo) {
				f()
			}
		}
	}()

	if s.tracing, err = tracing.Start(ctx, cfg.Tracing, log); err != nil {
		return nil, err
	}
	undo = append(undo, s.stopTracing)
	tracer := s.tracing.Tracer()

	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	storeCfg := cfg.Store
	storeCfg.Redis.Tracer = tracer
	store, redisParts, overridesBackend, closeStore, err := newStore(ctx, storeCfg, cfg.Names.redis(), s.reg, log)
	if err != nil {
		return nil, err
	}
	s.closeStore = closeStore
	s.storeNodes = redisParts.Nodes
	undo = append(undo, closeStore)
	s.overrides = newOverrides(ctx, overridesBackend, cfg.Store, log)
	s.reg.MustRegister(s.overrides.Collectors()...)
	var hooks Hooks
	if cfg.Plugins.Start != nil {
		if hooks, err = cfg.Plugins.Start(Parts{Store: store, Redis: redisParts, Service: cfg.Service, Registry: s.reg, Logger: log}); err != nil {
			return nil, err
		}
		s.tasks = hooks.Tasks
	}
	// rls's own metrics watch every decision, then the plug-ins' observers.
	metrics := decisionmetrics.New(s.reg, decisionmetrics.Options{MaxValueSeries: cfg.Service.MaxValueSeries, ShadowAll: cfg.Service.ShadowAll})
	observers := append([]service.Observer{metrics}, hooks.Observers...)
	if s.insight, err = newInsight(cfg, redisParts, log); err != nil {
		return nil, err
	}
	undo = append(undo, s.insight.close)
	observers = append(observers, s.insight.observers()...)
	s.loads = reloadlog.New(0, nil)
	observers = append(observers, s.loads)
	if s.insight.log != nil {
		s.reg.MustRegister(s.insight.log.Collectors()...)
	}
	s.svc = service.New(service.Options{
		Store:           store,
		StoreDoesIO:     cfg.Store.Kind == Redis,
		OnStoreError:    cfg.Service.OnStoreError,
		Headers:         cfg.Service.Headers,
		CountDeniedHits: cfg.Service.CountDeniedHits,
		QuotaAll:        cfg.Service.QuotaAll,
		ShadowAll:       cfg.Service.ShadowAll,
		Logger:          log,
		Observers:       observers,
		AnswerRules:     hooks.AnswerRules,
		Tracer:          tracer,
		StoreName:       string(cfg.Store.Kind),
		Overrides:       s.overrides,
	})
	if initial != nil {
		s.svc.Reload(func() (*config.Config, error) { return initial, nil })
	}

	l := cfg.Listeners
	grpcLis, err := net.Listen("tcp", l.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Names.grpcAddr(), err)
	}
	undo = append(undo, func() { grpcLis.Close() })
	httpLis, err := net.Listen("tcp", l.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Names.httpAddr(), err)
	}
	undo = append(undo, func() { httpLis.Close() })
	grpcTLS, httpTLS := l.TLS.tlsOn()
	var tlsSource *tlsfiles.Source
	if grpcTLS || httpTLS {
		if tlsSource, err = tlsfiles.New(l.TLS.Files, log); err != nil {
			return nil, err
		}
	}
	if l.AdminTokenFile != "" {
		if s.adminToken, err = httpapi.NewTokenFile(l.AdminTokenFile, log); err != nil {
			return nil, err
		}
	}

	rls := envoyrls.New(s.svc)
	quota := rlqs.New(s.svc, rlqs.Options{StoreTimeout: cfg.Store.Redis.Timeout, Tracer: tracer})
	s.reg.MustRegister(quota.Collectors()...)
	s.grpc, s.health = newGRPCServer(l, s.svc, rls, quota, tlsSource, cfg.Plugins.GRPCTLS, s.tracing)
	undo = append(undo, s.grpc.Stop) // its stream workers run from here
	s.http = s.newHTTPServer(rls, quota)
	undo = append(undo, s.stopExtras)
	for _, x := range cfg.Plugins.Listeners {
		if _, err := s.serveExtra(x.Name, x.Addr, x.Handler(s.svc, s.reg), extraLimits(l.HTTP)); err != nil {
			return nil, err
		}
	}
	s.grpcAddr, s.httpAddr = grpcLis.Addr(), httpLis.Addr()
	go func() { s.errc <- s.grpc.Serve(grpcLis) }()
	go func() {
		if httpTLS {
			s.errc <- s.http.ServeTLS(httpLis, tlsSource.Config())
			return
		}
		s.errc <- s.http.Serve(httpLis)
	}()
	log.Info("serving", "grpc", s.grpcAddr.String(), "http", s.httpAddr.String(), "tls_grpc", grpcTLS, "tls_http", httpTLS,
		"http_max_connections", l.HTTP.MaxConnections, "grpc_max_streams", l.GRPC.MaxStreams,
		"store", string(cfg.Store.Kind), "config", cfg.Files.Path, "domains", len(initial.Domains()))
	if s.tracing != nil && s.tracing.Endpoint() != "" {
		log.Info("tracing", "endpoint", s.tracing.Endpoint(), "protocol", cfg.Tracing.Protocol.String())
	}
	if cfg.Tracing.Console != nil {
		log.Info("tracing", "exporter", "console")
	}
	return s, nil
}

// newOverrides returns the keeper of the runtime overrides kept in b,
// holding what b holds now (within 2 s: a store that does not answer yet
// leaves it empty and stale until Run reads them). Expiries follow the
// store's clock, or its test clock.
func newOverrides(ctx context.Context, b overrides.Backend, c Store, log *slog.Logger) *overrides.Keeper {
	now := c.Memory.Now
	if c.Kind == Redis {
		now = c.Redis.Now
	}
	k := overrides.New(b, overrides.Options{Now: now, Logger: log})
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := k.Load(lctx); err != nil {
		log.Warn("overrides not read yet; they apply once the store answers", "error", err)
	}
	return k
}

// Addrs returns the addresses the gRPC and HTTP listeners listen on.
func (s *Server) Addrs() (grpcAddr, httpAddr net.Addr) { return s.grpcAddr, s.httpAddr }

// Reload asks the config source to reload the config, at once and without
// waiting for it; why says what asked, in the log ("SIGHUP"). Asks that
// come while one waits are one. Safe for concurrent use.
func (s *Server) Reload(why string) {
	select {
	case s.asked <- why:
	default:
	}
}

// Run serves until ctx ends or a listener's server fails, keeping the gRPC
// health status equal to readiness and the config current (the source's
// Run) and running the plug-ins' tasks; then it drains: no new work,
// requests in flight get the shutdown timeout, the listeners stop, the
// tasks end, and the store is closed. It returns nil after ctx ended, else
// the listener's error.
func (s *Server) Run(ctx context.Context) error {
	defer s.closeStore()
	// The tasks outlive ctx until the drain is done, so that they see
	// every decision.
	tasks, stopTasks := context.WithCancel(context.WithoutCancel(ctx))
	var taskWG sync.WaitGroup
	for _, task := range s.tasks {
		taskWG.Go(func() { task(tasks) })
	}
	defer func() {
		stopTasks()
		taskWG.Wait()
	}()
	bg, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// The decision log's writer runs until the drain is over (it writes
	// the decisions in flight); the top keys' publisher until bg ends.
	if l := s.insight.log; l != nil {
		l.Start()
		defer l.Close()
	}
	if t := s.insight.top; t != nil {
		wg.Go(func() { t.Publish(bg) })
	}
	wg.Go(func() { followReadiness(bg, s.svc, s.health, 2*time.Second) })
	wg.Go(func() { s.source.Run(bg, s.svc, s.asked, s.log) })
	wg.Go(func() { s.overrides.Run(bg) })
	if s.adminToken != nil {
		wg.Go(func() { s.adminToken.Watch(bg, httpapi.DefaultTokenCheckEvery) })
	}
	var err error
	select {
	case <-ctx.Done():
	case e := <-s.errc:
		err = fmt.Errorf("serving: %w", e)
	}
	stop()
	wg.Wait()
	s.drain()
	s.stopExtras()
	s.stopTracing()
	return err
}

// stopTracing sends the spans still buffered (for 5 s at most: a receiver
// that does not answer must not hold the shutdown) and stops the exporter.
func (s *Server) stopTracing() {
	if s.tracing == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.tracing.Shutdown(ctx); err != nil {
		s.log.Warn("tracing: spans not sent at shutdown", "error", err)
	}
}

// drain stops taking new work, finishes what is in flight within the
// shutdown timeout, then stops the gRPC and HTTP servers.
func (s *Server) drain() {
	timeout := s.cfg.Listeners.ShutdownTimeout
	s.log.Info("shutting down", "timeout", timeout)
	s.draining.Store(true)
	s.health.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	if err := s.http.Shutdown(sctx); err != nil {
		s.log.Warn("HTTP shutdown", "error", err)
	}
	select {
	case <-stopped:
	case <-sctx.Done():
		s.log.Warn("gRPC drain timed out; closing the remaining connections")
		s.grpc.Stop()
		<-stopped
	}
	s.log.Info("stopped")
}
