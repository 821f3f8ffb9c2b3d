package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// StoreErrorPolicy says what a request gets when the store fails or times
// out (--on-store-error).
type StoreErrorPolicy uint8

// The policies.
const (
	// FailError returns ErrStoreUnavailable, which the transports turn into
	// gRPC UNAVAILABLE or HTTP 503, so the proxy's own failure mode decides.
	FailError StoreErrorPolicy = iota
	// FailAllow answers OK.
	FailAllow
	// FailDeny answers OVER_LIMIT for every descriptor that has a limit.
	FailDeny
)

// ParseStoreErrorPolicy parses "error", "allow" or "deny".
func ParseStoreErrorPolicy(s string) (StoreErrorPolicy, error) {
	switch s {
	case "error":
		return FailError, nil
	case "allow":
		return FailAllow, nil
	case "deny":
		return FailDeny, nil
	}
	return 0, fmt.Errorf("%q is not one of error|allow|deny", s)
}

func (p StoreErrorPolicy) String() string {
	return [...]string{"error", "allow", "deny"}[p]
}

// ErrStoreUnavailable is returned (wrapped, with the store's error) when the
// store fails under FailError.
var ErrStoreUnavailable = errors.New("rate-limit store unavailable")

// ErrUnknownDomain is returned by CheckHTTP for a domain that the config
// does not have.
var ErrUnknownDomain = errors.New("unknown domain")

// ErrConfigChanged is returned for a request pinned to a config
// (Request.Config) that is no longer the current one: nothing was decided.
var ErrConfigChanged = errors.New("the config changed")

// errNoConfig is returned by Ready before a config is loaded.
var errNoConfig = errors.New("no config loaded")

// Options configure a Service.
type Options struct {
	// Store decides. A store that does I/O bounds its own calls
	// (--store-timeout) and honours the context's deadline.
	Store engine.Store
	// StoreDoesIO says the store waits on I/O (Redis): its calls are timed
	// (Decision.StoreTime), and bounded by the caller's deadline less
	// answerMargin, so that the caller gets the store-error policy's answer
	// rather than its own timeout. (The memory store answers in
	// microseconds: neither is worth its cost there.)
	StoreDoesIO  bool
	OnStoreError StoreErrorPolicy
	// CountDeniedHits makes every limit count a request's hits whether or
	// not it is admitted (--count-denied-hits), as envoyproxy/ratelimit
	// does; otherwise only limits with count_denied_hits do.
	CountDeniedHits bool
	// Headers selects the rate-limit headers put in RateLimitService
	// responses.
	Headers HeaderMode
	// Now reads the clock for what an answer says in absolute time: the
	// length of the calendar window that ends at a result's reset (see
	// Policy). It need not be the store's clock (Redis's TIME): hours of
	// difference change nothing. nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger

	// QuotaAll treats every descriptor as a quota_mode one: a request is
	// denied only when all its descriptors are over.
	QuotaAll bool
	// ShadowAll puts every limit in shadow mode (--shadow): judged and
	// counted, never denying. Answers keep the limits' headers (as
	// envoyproxy/ratelimit's SHADOW_MODE does).
	ShadowAll bool
	// Observers are told of every config, answer and reset (hooks.go):
	// rls's metrics, a front end's stats.
	Observers []Observer
	// AnswerRules are the last steps on every decided answer, in order
	// (hooks.go).
	AnswerRules []AnswerRule

	// Tracer, when not nil, makes the spans of each decision (tracing.go):
	// children of the span that ctx carries, the store's spans theirs. nil
	// makes none, at no cost.
	Tracer trace.Tracer
	// StoreName names the store in the spans (rls.store): memory or redis.
	StoreName string

	// Overrides, when not nil, are the runtime overrides of the config's
	// limits (overrides.go): each config is bound to them before it
	// becomes current, and each decision applies them in its resolve step.
	Overrides Overrides
}

// Service answers rate-limit requests against the current config and a
// store. It is safe for concurrent use; the config is swapped atomically.
type Service struct {
	store        engine.Store
	storeDoesIO  bool
	all          allLimits
	onStoreError StoreErrorPolicy
	headers      HeaderMode
	now          func() time.Time
	log          *slog.Logger
	errLog       rate.Sometimes
	neverLog     rate.Sometimes
	current      atomic.Pointer[loaded]
	scratch      sync.Pool // *scratch
	observers    []Observer
	rules        []AnswerRule
	tracer       trace.Tracer // nil: no spans
	storeName    string
	overrides    Overrides // nil: none
}

// loaded is a config with what the observers derived from it.
type loaded struct {
	cfg      *config.Config
	observed []any // by observer: what ForConfig returned
}

// New returns a service with no config: requests are answered as for
// unknown domains until SetConfig or Reload succeeds.
func New(opts Options) *Service {
	s := &Service{
		store:        opts.Store,
		storeDoesIO:  opts.StoreDoesIO,
		all:          allLimits{countDenied: opts.CountDeniedHits, quota: opts.QuotaAll, shadow: opts.ShadowAll},
		onStoreError: opts.OnStoreError,
		headers:      opts.Headers,
		now:          opts.Now,
		log:          opts.Logger,
		errLog:       rate.Sometimes{Interval: 10 * time.Second},
		neverLog:     rate.Sometimes{Interval: 10 * time.Second},
		observers:    opts.Observers,
		rules:        opts.AnswerRules,
		tracer:       opts.Tracer,
		storeName:    opts.StoreName,
		overrides:    opts.Overrides,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.scratch.New = func() any { return new(scratch) }
	return s
}

// SetConfig makes cfg the current config, once every observer has made
// what it derives from it (ForConfig).
func (s *Service) SetConfig(cfg *config.Config) {
	if s.overrides != nil {
		s.overrides.Bind(cfg)
	}
	l := &loaded{cfg: cfg}
	for _, o := range s.observers {
		l.observed = append(l.observed, o.ForConfig(cfg))
	}
	s.current.Store(l)
}

// Reload loads a config with load and makes it current. On error the
// current config stays, and the error is logged, returned and told to the
// observers (Reloaded).
func (s *Service) Reload(load func() (*config.Config, error)) error {
	cfg, err := load()
	if err != nil {
		s.log.Error("config not loaded; the previous config stays in use", "error", err)
		for _, o := range s.observers {
			o.Reloaded(err)
		}
		return err
	}
	s.SetConfig(cfg)
	for _, o := range s.observers {
		o.Reloaded(nil)
	}
	s.log.Info("config loaded", "domains", len(cfg.Domains()), "limits", len(cfg.Limits()), "files", len(cfg.Files()))
	return nil
}

// Config returns the current config, nil before the first load.
func (s *Service) Config() *config.Config {
	if l := s.current.Load(); l != nil {
		return l.cfg
	}
	return nil
}

// Ready reports whether the service can answer: a config is loaded and the
// store answers.
func (s *Service) Ready(ctx context.Context) error {
	if s.current.Load() == nil {
		return errNoConfig
	}
	if err := s.store.Ping(ctx); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}
