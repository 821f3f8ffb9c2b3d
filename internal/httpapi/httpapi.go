// Package httpapi is the HTTP adapter: health and readiness, Prometheus
// metrics, the /auth forward-auth endpoint for nginx auth_request, and the
// debug endpoints (the config, /debug/explain, pprof), /admin/reset and who
// may use those two (loopback clients, the bearer token of a TokenFile); it
// mounts /json, which envoyrls serves (the RateLimitService's own protocol
// in JSON).
// Server serves them within Limits (timeouts, a bound on open
// connections). It converts HTTP to the service's terms and back, and
// holds no rate-limit logic.
package httpapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/httpdesc"
	"github.com/rlsproject/rls/internal/reloadlog"
	"github.com/rlsproject/rls/internal/service"
)

// Service is what the HTTP endpoints ask; *service.Service implements it.
type Service interface {
	Ready(ctx context.Context) error
	Config() *config.Config
	CheckHTTP(ctx context.Context, domain string, r httpdesc.Request) (*service.Response, error)
}

// DebugAccess says who may use /debug/*.
type DebugAccess uint8

// The debug access modes (--debug-endpoints).
const (
	// DebugLoopback answers only clients on a loopback address (the default).
	DebugLoopback DebugAccess = iota
	DebugOn
	DebugOff
)

// ParseDebugAccess parses loopback|on|off.
func ParseDebugAccess(s string) (DebugAccess, error) {
	switch s {
	case "loopback":
		return DebugLoopback, nil
	case "on":
		return DebugOn, nil
	case "off":
		return DebugOff, nil
	}
	return 0, errors.New(`"` + s + `" is not one of loopback|on|off`)
}

// Options configure the handler.
type Options struct {
	Service Service
	// JSON serves POST /json (envoyrls: the RateLimitService in proto3
	// JSON); nil leaves /json unmounted.
	JSON     http.Handler
	Gatherer prometheus.Gatherer
	Debug    DebugAccess
	// Auth configures /auth/{domain}.
	Auth AuthOptions
	// Explain answers POST /debug/explain; nil means Service when it
	// implements Explainer (else the endpoint is not mounted).
	Explain Explainer
	// Reset answers POST /admin/reset; nil means Service when it
	// implements Resetter (else the endpoint is not mounted).
	Reset Resetter
	// Top answers GET /debug/top; nil leaves it unmounted (404).
	Top TopKeys
	// Overrides, when set, answers /admin/overrides (PUT, GET, DELETE;
	// access as /admin/reset), and /readyz and /debug/config say what it
	// holds.
	Overrides Overrider
	// AdminToken, when set, lets clients that are not on a loopback
	// address use the admin endpoints with its bearer token.
	AdminToken *TokenFile
	// RequireToken makes every request to /admin/ and /debug/ (the
	// config, explain, pprof) need the bearer token of AdminToken,
	// loopback clients' too (--admin-require-token); Debug still says who
	// may ask /debug/ at all. Without AdminToken those requests are then
	// all refused.
	RequireToken bool
	// Reloads, when set, gives GET /debug/status the last config loads.
	Reloads func() []reloadlog.Load
	// StoreName is the store's kind for GET /debug/status (memory, redis).
	StoreName string
	// RLQS, when set, gives GET /debug/status the RLQS streams served.
	RLQS RLQSStreams
	// StoreNodes, when set, pings each node of the store (Redis's) for
	// GET /debug/status.
	StoreNodes func(ctx context.Context) []StoreNode
	// UI, when set, makes the operator page: it is given the handler of
	// every other endpoint (the page's server side reads them as any
	// client would) and is served at /ui/ (access as /debug/*, but for
	// the token: a browser cannot send one when it opens a page, and the
	// page's data comes from endpoints that ask for it).
	UI     func(api http.Handler) http.Handler
	Logger *slog.Logger
}

// New returns the HTTP handler of the endpoints the README lists (HTTP and gRPC endpoints).
func New(opts Options) http.Handler {
	h := &handler{Options: opts, refused: &rate.Sometimes{Interval: time.Second}}
	if h.Logger == nil {
		h.Logger = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", h.ready)
	mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(h.Logger.Handler(), slog.LevelError)}))
	if opts.JSON != nil {
		mux.Handle("POST /json", opts.JSON)
	}
	mux.HandleFunc("/auth/{domain}", h.auth)
	mux.Handle("GET /debug/config", h.debug(http.HandlerFunc(h.config)))
	if h.Explain == nil {
		h.Explain, _ = opts.Service.(Explainer)
	}
	if h.Explain != nil {
		mux.Handle("POST /debug/explain", h.debug(http.HandlerFunc(h.explain)))
	}
	if h.Reset == nil {
		h.Reset, _ = opts.Service.(Resetter)
	}
	if h.Reset != nil {
		mux.Handle("POST /admin/reset", h.admin(h.reset))
	}
	if h.Top != nil {
		mux.Handle("GET /debug/top", h.debug(http.HandlerFunc(h.top)))
	}
	if h.Overrides != nil {
		mux.Handle("PUT /admin/overrides", h.admin(h.putOverride))
		mux.Handle("GET /admin/overrides", h.admin(h.listOverrides))
		mux.Handle("DELETE /admin/overrides", h.admin(h.deleteOverride))
	}
	mux.Handle("GET /debug/status", h.debug(http.HandlerFunc(h.status)))
	RegisterPprof(mux, h.debug)
	if opts.UI != nil {
		mux.Handle("/ui/", h.debugOpen(opts.UI(mux)))
	}
	return mux
}

// RegisterPprof serves net/http/pprof's handlers under /debug/pprof/ on
// mux, each through guard (nil: none).
func RegisterPprof(mux *http.ServeMux, guard func(http.Handler) http.Handler) {
	if guard == nil {
		guard = func(h http.Handler) http.Handler { return h }
	}
	for path, f := range map[string]http.HandlerFunc{
		"/debug/pprof/":        pprof.Index,
		"/debug/pprof/cmdline": pprof.Cmdline,
		"/debug/pprof/profile": pprof.Profile,
		"/debug/pprof/symbol":  pprof.Symbol,
		"/debug/pprof/trace":   pprof.Trace,
	} {
		mux.Handle(path, guard(f))
	}
}

type handler struct {
	Options
	refused *rate.Sometimes // bounds the log of refused admin requests
}

func (h *handler) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := h.Service.Ready(ctx); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n"+h.overridesReady())
}

func (h *handler) config(w http.ResponseWriter, _ *http.Request) {
	cfg := h.Service.Config()
	if cfg == nil {
		http.Error(w, "no config loaded", http.StatusServiceUnavailable)
		return
	}
	// Streamed, and bounded: past the cap the dump ends with a note.
	w.Header().Set("Content-Type", "application/json")
	cfg.WriteJSON(w, config.DefaultMaxDumpBytes, h.overridesDump()...)
	io.WriteString(w, "\n")
}

// debug guards a debug endpoint per the DebugAccess, then, with
// RequireToken, asks for the bearer token.
func (h *handler) debug(next http.Handler) http.Handler {
	return h.debugOpen(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.RequireToken && !h.tokenGiven(w, r) {
			return
		}
		next.ServeHTTP(w, r)
	}))
}

// debugOpen guards per the DebugAccess only (the operator page's shell
// holds nothing that needs the token).
func (h *handler) debugOpen(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch h.Debug {
		case DebugOff:
			http.NotFound(w, r)
			return
		case DebugLoopback:
			if !isLoopback(r.RemoteAddr) {
				http.Error(w, "debug endpoints answer loopback clients only (--debug-endpoints)", http.StatusForbidden)
				return
			}
			if why := rebound(r); why != "" {
				h.refuse(r, why)
				http.Error(w, "refused: "+why, http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
