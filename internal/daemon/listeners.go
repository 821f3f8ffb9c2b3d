package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/rlsproject/rls/internal/authz"
	"github.com/rlsproject/rls/internal/envoyrls"
	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/rlqs"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/tlsfiles"
	"github.com/rlsproject/rls/internal/tracing"
	"github.com/rlsproject/rls/internal/ui"
)

// tlsOn reports whether the gRPC and the HTTP listener serve TLS.
func (t TLS) tlsOn() (grpcTLS, httpTLS bool) {
	return t.Files.Cert != "" && t.GRPC, t.Files.Cert != "" && t.HTTP
}

// newGRPCServer returns the gRPC server with every service registered, and
// its health server. tlsSource is nil when l serves no TLS; tlsHook, when
// not nil, changes the TLS config (Plugins.GRPCTLS); tp, when not nil,
// makes the server spans of the decisions.
func newGRPCServer(l Listeners, svc *service.Service, rls *envoyrls.Server, quota *rlqs.Server, tlsSource *tlsfiles.Source, tlsHook func(*tls.Config) *tls.Config, tp *tracing.Provider) (*grpc.Server, *health.Server) {
	// rls's codec: descriptor values need not be UTF-8 (Envoy copies header bytes)
	gopts := append(grpcserver.Options(l.GRPC), envoyrls.ServerCodec())
	gopts = append(gopts, tp.ServerOptions(
		[]string{rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, authv3.Authorization_Check_FullMethodName},
		[]string{rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName})...)
	if on, _ := l.TLS.tlsOn(); on {
		cfg := tlsSource.Config()
		if tlsHook != nil {
			cfg = tlsHook(cfg)
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	gs := grpc.NewServer(gopts...)
	rls.Register(gs)
	authz.New(svc, l.TrustedProxies).Register(gs)
	quota.Register(gs)
	hs := health.NewServer()
	// Not serving until followReadiness has asked the service (its first
	// question may wait for a store that does not answer); grpc-go's
	// default would say SERVING meanwhile.
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs, hs
}

// newHTTPServer returns the server of the HTTP listener: the HTTP API
// behind /healthcheck.
func (s *Server) newHTTPServer(rls *envoyrls.Server, quota *rlqs.Server) *httpapi.Server {
	opts := httpapi.Options{
		Service:      s.svc,
		JSON:         rls.JSON(),
		Gatherer:     s.reg,
		Debug:        s.cfg.Listeners.Debug,
		Auth:         httpapi.AuthOptions{TrustedProxies: s.cfg.Listeners.TrustedProxies},
		AdminToken:   s.adminToken,
		RequireToken: s.cfg.Listeners.AdminRequireToken,
		Overrides:    s.overrides,
		Reloads:      s.loads.Loads,
		StoreName:    string(s.cfg.Store.Kind),
		RLQS:         quota,
		Logger:       s.log,
	}
	if s.storeNodes != nil {
		opts.StoreNodes = func(ctx context.Context) []httpapi.StoreNode {
			var out []httpapi.StoreNode
			for _, n := range s.storeNodes(ctx) {
				out = append(out, httpapi.StoreNode{Addr: n.Addr, Seconds: n.Seconds, Error: n.Error})
			}
			return out
		}
	}
	if s.cfg.Listeners.UI {
		opts.UI = func(api http.Handler) http.Handler { return ui.New(api) }
	}
	if s.insight.top != nil { // not a nil *Keys in the interface
		opts.Top = s.insight.top
	}
	api := httpapi.New(opts)
	return httpapi.NewServer(s.withHealthcheck(s.tracing.Handler(api, decisionRoute)), s.cfg.Listeners.HTTP, s.log, s.reg)
}

// decisionRoute is the route of an HTTP request that asks for a decision,
// whose server span tracing makes: POST /json, /auth/{domain}; "" for the
// others (health, metrics, debug).
func decisionRoute(r *http.Request) string {
	switch {
	case r.URL.Path == "/json":
		return "/json"
	case strings.HasPrefix(r.URL.Path, "/auth/"):
		return "/auth/{domain}"
	}
	return ""
}

// withHealthcheck serves GET /healthcheck in front of next: 200 "OK" while
// a config is loaded and the server is not shutting down, else 500 (see
// Plugins). Envoy Gateway's probes ask it, as envoyproxy/ratelimit serves
// it. Unlike /readyz it does not follow the store.
func (s *Server) withHealthcheck(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthcheck" {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch {
		case s.draining.Load():
			http.Error(w, "shutting down", http.StatusInternalServerError)
		case s.svc.Config() == nil:
			http.Error(w, "no config loaded", http.StatusInternalServerError)
		default:
			io.WriteString(w, "OK")
		}
	})
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

// extraLimits are the limits of an extra listener: the HTTP listener's
// (timeouts, header size), with at most MaxExtraConnections connections.
func extraLimits(l httpapi.Limits) httpapi.Limits {
	if l.MaxConnections <= 0 || l.MaxConnections > MaxExtraConnections {
		l.MaxConnections = MaxExtraConnections
	}
	return l
}

// extraServer is an extra listener, serving.
type extraServer struct {
	name string
	srv  *httpapi.Server
	done chan struct{} // closed when Serve has returned
}

// serveExtra serves h on addr (named what in errors and logs) within lim,
// until stopped by stopExtras, and returns the address it listens on. Its
// connections' metrics are not registered: rls_http_connections is the
// HTTP listener's.
func (s *Server) serveExtra(what, addr string, h http.Handler, lim httpapi.Limits) (net.Addr, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	e := &extraServer{name: what, srv: httpapi.NewServer(h, lim, s.log, nil), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		if err := e.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("listener stopped", "listener", what, "error", err)
		}
	}()
	s.extras = append(s.extras, e)
	s.log.Info("serving", "listener", what, "addr", lis.Addr().String())
	return lis.Addr(), nil
}

// stopExtras stops the extra listeners, in reverse order: requests in
// flight get the shutdown timeout; past it, what is left ends within the
// write timeout. It may be called more than once.
func (s *Server) stopExtras() {
	for _, e := range slices.Backward(s.extras) {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Listeners.ShutdownTimeout)
		e.srv.Shutdown(ctx)
		cancel()
		<-e.done
	}
	s.extras = nil
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
