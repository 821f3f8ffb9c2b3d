package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	// in rls_store_duration_seconds, and bounded by the caller's deadline
	// less answerMargin, so that the caller gets the store-error policy's
	// answer rather than its own timeout. (The memory store answers in
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
	Now func() time.Time
	// Registry receives the metrics; nil means no metrics are exported.
	Registry prometheus.Registerer
	// MaxValueSeries bounds the distinct descriptor series of one limit
	// whose descriptor asks for per-value metrics (detailed_metric,
	// value_to_metric); further values are counted in OtherSeries. 0 means
	// DefaultMaxValueSeries.
	MaxValueSeries int
	Logger         *slog.Logger

	// FullnessKeysPerLimit and FullnessKeys bound the fullness sample
	// (rls_limit_keys_fullness, fullness.go): the keys at least half full
	// kept per limit, and in all. 0 means DefaultFullnessKeysPerLimit and
	// DefaultFullnessKeys. Entries expire by Now when it is set, else by
	// the monotonic clock.
	FullnessKeysPerLimit, FullnessKeys int

	// QuotaAll treats every descriptor as a quota_mode one: a request is
	// denied only when all its descriptors are over.
	QuotaAll bool
	// ShadowAll puts every limit in shadow mode (--shadow): counted, and
	// its denials in rls_shadow_denials_total, never denying. Answers keep
	// the limits' headers (as envoyproxy/ratelimit's SHADOW_MODE does).
	ShadowAll bool
	// Observers are told of every config and decision (hooks.go).
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
	m            *metrics
	dm           *domainMetrics
	full         *fullness // nil: no metrics
	current      atomic.Pointer[loaded]
	scratch      sync.Pool // *scratch
	observers    []Observer
	rules        []AnswerRule
	tracer       trace.Tracer // nil: no spans
	storeName    string
}

// loaded is a config with what the service derives from it once.
type loaded struct {
	cfg      *config.Config
	counters []limitMetrics           // by Limit.Index
	override map[string]*limitMetrics // by domain name
	domains  map[string]domainSeries  // by domain name
	observed []any                    // by observer: what ForConfig returned
	fullGen  uint64                   // the generation of its fullness samples
}

// metricsOf returns the metrics of limit, of domain dom: its own, or its
// domain's for a request override.
func (ld *loaded) metricsOf(dom *config.Domain, limit *config.Limit) *limitMetrics {
	if limit.Index >= 0 && limit.Index < len(ld.counters) {
		return &ld.counters[limit.Index]
	}
	return ld.override[dom.Name]
}

// New returns a service with no config: requests are answered as for
// unknown domains until SetConfig or Reload succeeds.
func New(opts Options) *Service {
	maxValues := opts.MaxValueSeries
	if maxValues <= 0 {
		maxValues = DefaultMaxValueSeries
	}
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
		m:            newMetrics(opts.Registry, maxValues, opts.ShadowAll),
		dm:           newDomainMetrics(opts.Registry),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if opts.Registry != nil {
		s.full = newFullness(opts.FullnessKeysPerLimit, opts.FullnessKeys, opts.Now)
		opts.Registry.MustRegister(s.full, newLimitValues(&s.current))
	}
	s.observers, s.rules = opts.Observers, opts.AnswerRules
	s.tracer, s.storeName = opts.Tracer, opts.StoreName
	s.scratch.New = func() any { return new(scratch) }
	return s
}

// SetConfig makes cfg the current config. The series of limits that the
// previous config had and cfg has not are deleted.
func (s *Service) SetConfig(cfg *config.Config) {
	l := &loaded{cfg: cfg}
	l.counters, l.override = s.m.forConfig(cfg)
	l.domains = s.dm.forConfig(cfg)
	if s.full != nil {
		l.fullGen = s.full.forConfig(cfg, l.counters, l.override)
	}
	for _, o := range s.observers {
		l.observed = append(l.observed, o.ForConfig(cfg))
	}
	s.current.Store(l)
	s.m.domains.Set(float64(len(cfg.Domains())))
	s.m.limits.Set(float64(len(cfg.Limits())))
}

// Reload loads a config with load and makes it current. On error the
// current config stays, the error is logged and returned, and
// rls_config_last_reload_successful is 0 until the next success.
func (s *Service) Reload(load func() (*config.Config, error)) error {
	cfg, err := load()
	if err != nil {
		s.m.reloadOK.Set(0)
		s.m.reloads.WithLabelValues("failure").Inc()
		s.log.Error("config not loaded; the previous config stays in use", "error", err)
		for _, o := range s.observers {
			o.Reloaded(err)
		}
		return err
	}
	s.SetConfig(cfg)
	s.m.reloadOK.Set(1)
	s.m.reloadTime.SetToCurrentTime()
	s.m.reloads.WithLabelValues("success").Inc()
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

// scratch holds the per-request buffers, reused through a pool.
type scratch struct {
	items   []engine.Item
	results []engine.Result
	owner   []int           // descriptor index of each item
	limits  []*config.Limit // the limit of each item
	key     []byte          // identities of the request's descriptors, back to back
	spans   [][2]int        // each limited descriptor's identity in key
	nodes   []*config.Descriptor
	built   [][]config.Entry
	label   []byte // the labels of a per-value series
}

// ShouldRateLimit decides req. It returns an *InvalidError for a malformed
// request and an error wrapping ErrStoreUnavailable (or the context's error)
// when the store fails under FailError.
func (s *Service) ShouldRateLimit(ctx context.Context, req *Request) (*Response, error) {
	return s.check(ctx, req, s.headers)
}

func (s *Service) check(ctx context.Context, req *Request, headers HeaderMode) (*Response, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	return s.decide(ctx, req, headers)
}

// decide answers a valid request, in a span when the service traces.
func (s *Service) decide(ctx context.Context, req *Request, headers HeaderMode) (*Response, error) {
	if s.tracer != nil {
		return s.decideTraced(ctx, req, headers)
	}
	return s.decideIn(ctx, req, headers, false)
}

// decideIn answers a valid request, in phases: resolve each descriptor's
// limits, build the store's items, apply them in one store call, and turn
// the results into statuses and headers. traced makes spans of the
// matching and the store call.
func (s *Service) decideIn(ctx context.Context, req *Request, headers HeaderMode, traced bool) (*Response, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)

	cur := s.current.Load()
	if req.Config != nil && (cur == nil || cur.cfg != req.Config) {
		return nil, ErrConfigChanged
	}
	var dom *config.Domain
	if cur != nil {
		dom = cur.cfg.Domain(req.Domain)
	}
	resp := newResponse(len(req.Descriptors))
	if dom == nil {
		// Unknown domain: OK with no limit, as envoyproxy/ratelimit does,
		// even with an override.
		for i := range resp.Statuses {
			resp.Statuses[i].Code = OK
		}
		s.dm.unknown.countUnmatched(len(req.Descriptors))
		s.m.requestsOK.Inc()
		s.finishAnswer(req, nil, resp, headers)
		return resp, nil
	}

	var replaced map[string]bool
	var unmatched int
	if traced {
		replaced, unmatched = s.matchTraced(ctx, sc, dom, req)
	} else {
		replaced, unmatched = sc.resolve(dom, req)
	}
	if unmatched > 0 {
		cur.domains[dom.Name].countUnmatched(unmatched)
	}
	sc.buildItems(req, resp, replaced, s.all)
	items := sc.items
	if len(items) == 0 {
		s.m.requestsOK.Inc()
		s.finishAnswer(req, sc.nodes, resp, headers)
		return resp, nil
	}

	if cap(sc.results) < len(items) {
		sc.results = make([]engine.Result, len(items))
	}
	results := sc.results[:len(items)]
	var admitted bool
	var err error
	if traced {
		admitted, err = s.applyTraced(ctx, items, results)
	} else {
		admitted, err = s.apply(ctx, items, results)
	}
	if err != nil {
		return s.storeFailed(req, resp, sc, headers, err)
	}

	if !admitted {
		resp.Code = OverLimit
		s.m.requestsOver.Inc()
	} else {
		s.m.requestsOK.Inc()
	}
	s.fillStatuses(cur, dom, req, resp, sc, results, headers != HeadersOff)
	if !admitted {
		if resp.Never = never(items, results); resp.Never {
			s.impossible(cur, dom, sc, results)
		}
	}
	if len(s.observers) > 0 {
		d := Decision{Request: req, Items: items, Limits: sc.limits, Owners: sc.owner, Results: results, Admitted: admitted}
		for i, o := range s.observers {
			o.Decided(cur.observed[i], &d)
		}
	}
	s.finishAnswer(req, sc.nodes, resp, headers)
	for i := range items {
		items[i] = engine.Item{} // drop references to config and strings
		sc.limits[i] = nil
	}
	return resp, nil
}

// resolve matches each descriptor of req that has no override in dom,
// into sc.nodes (nil for an override or no match), and returns the names
// of the limits that the matched limits replace and the number of
// descriptors without an override that matched no node with limits.
func (sc *scratch) resolve(dom *config.Domain, req *Request) (replaced map[string]bool, unmatched int) {
	sc.nodes = sc.nodes[:0]
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		var node *config.Descriptor
		if d.Override == nil {
			node = dom.Match(d.Entries)
			if node == nil || len(node.Limits) == 0 {
				unmatched++
			}
			if node != nil {
				for _, l := range node.Limits {
					for _, name := range l.Replaces {
						if replaced == nil {
							replaced = make(map[string]bool)
						}
						replaced[name] = true
					}
				}
			}
		}
		sc.nodes = append(sc.nodes, node)
	}
	return replaced, unmatched
}

// buildItems turns the resolved limits of req into sc.items, one per limit
// that counts (not replaced, not unlimited), with sc.owner[i] the index of
// item i's descriptor, and gives unlimited descriptors their status.
// all says what the server's switches make of every limit.
func (sc *scratch) buildItems(req *Request, resp *Response, replaced map[string]bool, all allLimits) {
	items := sc.items[:0]
	owner := sc.owner[:0]
	limits := sc.limits[:0]
	sc.key, sc.spans = sc.key[:0], sc.spans[:0]
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		st := &resp.Statuses[i]
		st.Code = OK
		node := sc.nodes[i]
		first := len(items)
		unlimited := false
		for _, l := range d.limits(node) {
			switch useOf(l, replaced) {
			case replacedUse:
				continue
			case unlimitedUse:
				unlimited = true
				continue
			}
			if len(items) == first {
				// The descriptor's identity goes into the request's key buffer;
				// its offsets are parked in Desc's place until the buffer
				// becomes one string below.
				start := len(sc.key)
				sc.key = engine.AppendDescriptorKey(sc.key, req.Domain, d.Entries, node.KeyShares(len(d.Entries)))
				sc.spans = append(sc.spans, [2]int{start, len(sc.key)})
			}
			var group int32
			if all.quota || (node != nil && node.QuotaMode) {
				group = int32(i + 1)
			}
			items = append(items, engine.Item{
				Rule:        l.Rule,
				Hits:        req.hits(d),
				Refund:      d.Refund,
				Shadow:      all.shadowed(l),
				CountDenied: (all.countDenied || l.CountDeniedHits) && !d.Refund,
				Group:       group,
			})
			owner = append(owner, i)
			limits = append(limits, l)
		}
		if unlimited && len(items) == first {
			st.Remaining = math.MaxUint32
		}
	}
	sc.items, sc.owner, sc.limits = items, owner, limits
	if len(items) > 0 {
		// One allocation for the identities of all descriptors.
		keys := string(sc.key)
		span := -1
		for i := range items {
			if i == 0 || owner[i] != owner[i-1] {
				span++
			}
			items[i].Desc = keys[sc.spans[span][0]:sc.spans[span][1]]
		}
	}
}

// limits are the limits that apply to d, which matched node (nil when it
// matched none): its override's, or node's.
func (d *Descriptor) limits(node *config.Descriptor) []*config.Limit {
	switch {
	case d.Override != nil:
		return []*config.Limit{overrideLimit(d.Override)}
	case node != nil:
		return node.Limits
	}
	return nil
}

// limitUse is what a request does with one of its limits.
type limitUse uint8

const (
	enforcedUse  limitUse = iota // an item is made of it
	replacedUse                  // another limit of the request replaces it by name
	unlimitedUse                 // unlimited: nothing to count
)

// useOf says what a request whose limits replace the names in replaced
// does with l. The one rule of which limits become items, for decisions
// and explanations.
func useOf(l *config.Limit, replaced map[string]bool) limitUse {
	switch {
	case l.Name != "" && replaced[l.Name]:
		return replacedUse
	case l.Unlimited:
		return unlimitedUse
	}
	return enforcedUse
}

// apply asks the store to judge items into results, timed and bounded
// when the store does I/O.
func (s *Service) apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if !s.storeDoesIO {
		return s.store.Apply(ctx, items, results)
	}
	start := time.Now()
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-answerMargin(deadline.Sub(start))))
		defer cancel()
	}
	admitted, err := s.store.Apply(ctx, items, results)
	if err != nil {
		s.m.storeFailed.Observe(time.Since(start).Seconds())
		return false, err
	}
	s.m.storeOK.Observe(time.Since(start).Seconds())
	return admitted, nil
}

// answerMargin is how long before its caller's deadline (gRPC's
// grpc-timeout: Envoy's timeout on the rate-limit call) a request stops
// waiting for the store and is answered per --on-store-error, given left,
// the time that was left: a tenth of it, between 1 and 5 milliseconds.
func answerMargin(left time.Duration) time.Duration {
	return min(max(left/10, time.Millisecond), 5*time.Millisecond)
}

// storeFailed answers per the store-error policy.
func (s *Service) storeFailed(req *Request, resp *Response, sc *scratch, headers HeaderMode, err error) (*Response, error) {
	s.m.storeErrors.Inc()
	s.errLog.Do(func() {
		s.log.Warn("store call failed", "domain", req.Domain, "policy", s.onStoreError, "error", err)
	})
	switch s.onStoreError {
	case FailAllow:
		s.m.requestsOK.Inc()
		return resp, nil
	case FailDeny:
		s.m.requestsOver.Inc()
		resp.Code = OverLimit
		var now time.Time
		for i, it := range sc.items {
			st, l := &resp.Statuses[sc.owner[i]], sc.limits[i]
			// No result: the limit's window from now, or for a calendar
			// limit what is left of the calendar window holding now.
			reset := l.Rule.Window
			if l.Rule.Calendar != nil {
				reset = s.calendarLeft(l, &now)
			}
			if !it.Shadow && st.Limit == nil {
				st.Code = OverLimit
				st.Limit = l
				st.ResetAfter = reset
			}
			if headers != HeadersOff {
				st.Policies = append(st.Policies, s.policy(l, reset, &now)) // every policy in the headers
			}
		}
		resp.Headers = appendHeaders(nil, headers, resp)
		return resp, nil
	}
	s.m.requestsError.Inc()
	return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
}

func (p StoreErrorPolicy) String() string {
	return [...]string{"error", "allow", "deny"}[p]
}

// allLimits is what the server's switches make of every limit: count
// denied hits (--count-denied-hits), quota mode (QUOTA_MODE), shadow mode
// (--shadow).
type allLimits struct{ countDenied, quota, shadow bool }

// shadowed reports whether l is judged in shadow mode: its own
// shadow_mode, or --shadow.
func (a allLimits) shadowed(l *config.Limit) bool { return l.Shadow || a.shadow }

// fillStatuses turns the store's results for sc.items into one status per
// descriptor and counts the verdicts.
func (s *Service) fillStatuses(cur *loaded, dom *config.Domain, req *Request, resp *Response, sc *scratch, results []engine.Result, withLimits bool) {
	var now time.Time // read once, when a calendar limit needs it
	var fullNow int64 // the fullness clock, read once when a sample needs it
	for i := range sc.items {
		it, r, l := &sc.items[i], &results[i], sc.limits[i]
		st := &resp.Statuses[sc.owner[i]]
		c := cur.metricsOf(dom, l)
		verdict := resultOver
		switch {
		case r.Admitted:
			verdict = resultOK
		case it.Shadow:
			verdict = resultShadowOver
		}
		sc.label = c.count(verdict, req.Descriptors[sc.owner[i]].Entries, sc.label)
		if s.full != nil {
			s.sampleFullness(cur, dom, c, l, it, r, &fullNow)
		}
		if withLimits {
			st.Policies = append(st.Policies, s.policy(l, r.Reset, &now))
		}
		if binds(st, it, r) {
			st.Limit = l
			st.Remaining = uint32(min(r.Remaining, math.MaxUint32))
			st.ResetAfter = r.Reset
			st.Never = false
			if !r.Admitted && !it.Shadow {
				st.Code = OverLimit
				if st.Never = r.Never; !r.Never {
					st.ResetAfter = r.RetryAfter
				}
			}
		}
	}
}

// binds reports whether item it (with result r) is more binding than the
// limit that st holds so far (see bindKey).
func binds(st *Status, it *engine.Item, r *engine.Result) bool {
	if st.Limit == nil {
		return true
	}
	deny := !r.Admitted && !it.Shadow
	k := bindKey{shadow: it.Shadow, deny: deny, never: deny && r.Never, wait: r.Reset, remaining: r.Remaining, window: it.Rule.Window}
	if deny && !r.Never {
		k.wait = r.RetryAfter
	}
	return k.over(st.bindKey())
}

// bindKey is what decides which limit binds a descriptor (its status) or a
// response (its single-valued headers): a denying non-shadow limit beats
// the others (one that never admits, else the one that waits longest),
// then the least remaining, then the longest window. Shadow limits bind
// only what has nothing else.
type bindKey struct {
	shadow, deny, never bool
	wait                time.Duration // until the retry when denying, else the reset
	remaining           uint64
	window              time.Duration
}

func (st *Status) bindKey() bindKey {
	return bindKey{shadow: st.Limit.Shadow, deny: st.Code == OverLimit, never: st.Never, wait: st.ResetAfter, remaining: uint64(st.Remaining), window: st.Limit.Rule.Window}
}

// over reports whether k binds rather than b.
func (k bindKey) over(b bindKey) bool {
	switch {
	case k.shadow != b.shadow:
		return b.shadow
	case k.deny != b.deny:
		return k.deny
	case k.deny && k.never != b.never:
		return k.never
	case k.deny:
		return k.wait > b.wait
	case k.remaining != b.remaining:
		return k.remaining < b.remaining
	}
	return k.window > b.window
}

// finishAnswer completes resp, a decided answer for req, whose
// descriptors matched nodes (nil for a domain the config lacks): the
// headers of mode, then the answer rules.
func (s *Service) finishAnswer(req *Request, nodes []*config.Descriptor, resp *Response, mode HeaderMode) {
	resp.Headers = appendHeaders(nil, mode, resp)
	if len(s.rules) > 0 {
		a := Answer{Request: req, Response: resp, Nodes: nodes}
		for _, r := range s.rules {
			r.Finish(&a)
		}
	}
}
