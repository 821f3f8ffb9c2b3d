// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3, the rate_limit_quota HTTP filter)
// from rls's limits. A stream's domain is a config domain; a bucket id (a
// map) names the descriptor whose path has exactly the bucket's keys,
// matched from the top of the domain's tree as descriptors are. A bucket
// without limits is told ALLOW_ALL. A bucket with limits gets, at each
// report, a grant: a number of requests taken from its limits in the
// store at once (all of its windows: the tightest binds), counted there
// as any RLS request's hits, and handed to the client as a token bucket
// that does not refill before its assignment expires. At the next report
// the client's use of it is reconciled: what it did not use goes back
// while the window it was counted in lasts, what it used beyond the grant
// (requests before its first assignment) is charged when it fits. So RLQS
// clients, RLS clients and nginx share one counter, and the requests
// admitted under grants stay within the limit plus the bound the README
// states (grants given less than a second before a window ends spill into
// the next one: TTLs are whole seconds). When nothing is left the bucket
// gets DENY_ALL until the window turns.
//
// It knows the service and the config; stores are the service's.
package rlqs

import (
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/service"
)

// Limits of the service, per stream and in all.
const (
	// MaxBuckets is the most buckets one stream may report: a report of
	// one more ends the stream (RESOURCE_EXHAUSTED), so that a client
	// cannot grow the server's state without bound.
	MaxBuckets = 10000
	// MaxStreams is the most streams served at once.
	MaxStreams = 10000
	// maxBucketKeys bounds a bucket id's keys (a descriptor is never that
	// deep in practice).
	maxBucketKeys = 16
)

// Defaults of Options.
const (
	// DefaultInterval is the reporting interval assumed of a client until
	// two of its reports show its own (Envoy's filter reports every 5 s).
	DefaultInterval = 5 * time.Second
	// unlimitedTTL is the time to live of ALLOW_ALL for a bucket without
	// limits: a reload that gives it limits is applied at its next report.
	unlimitedTTL = time.Hour
)

// Options configure a Server.
type Options struct {
	// Now is the clock; nil is time.Now. It must be the store's.
	Now func() time.Time
	// StoreTimeout is the store's bound on a decision once sent: a grant's
	// unused requests are given back only while that surely lands in the
	// window they were counted in.
	StoreTimeout time.Duration
	// Tracer, when not nil, makes a span of each report (tracing.go); nil
	// makes none.
	Tracer trace.Tracer
}

// Server is the RLQS service. Safe for concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	svc     *service.Service
	opts    Options
	streams chan struct{} // a token per stream served
	metrics *metrics
}

// New returns the service answering from svc's config and store.
func New(svc *service.Service, opts Options) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{svc: svc, opts: opts, streams: make(chan struct{}, MaxStreams)}
	s.metrics = newMetrics(func() float64 { return float64(len(s.streams)) })
	return s
}

// Register registers the service on gs.
func (s *Server) Register(gs *grpc.Server) { rlqsv3.RegisterRateLimitQuotaServiceServer(gs, s) }

// StreamRateLimitQuotas implements the service: one Session per stream,
// an answer per report.
func (s *Server) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		return status.Errorf(codes.ResourceExhausted, "rls serves %d RLQS streams at most", MaxStreams)
	}
	ctx := stream.Context()
	// A stream that ends leaves its grants counted until their windows
	// end: its client may still be spending them.
	ss := s.NewSession()
	defer ss.end()
	for {
		reports, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var resp *rlqsv3.RateLimitQuotaResponse
		if s.opts.Tracer != nil {
			resp, err = s.reportTraced(ctx, ss, reports)
		} else {
			resp, err = ss.Report(ctx, reports)
		}
		if err != nil {
			return err
		}
		if len(resp.BucketAction) == 0 {
			continue
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// Session is one client's stream: its domain and buckets.
type Session struct {
	s       *Server
	mu      sync.Mutex
	domain  string
	buckets map[string]*bucket // by the bucket id's canonical form
}

// bucket is what a session knows of one of its buckets.
type bucket struct {
	id      *rlqsv3.BucketId
	cfg     *config.Config // the config the entries were resolved in
	entries []config.Entry // ordered as the descriptor path; nil: no limits
	limited bool

	lastReport time.Time
	interval   time.Duration // between the client's reports, as seen
	rate       float64       // requests per second the client sees (allowed + denied)
	grant      uint64        // requests of the assignment in force, counted in the store
	grantEnd   time.Time     // the end of the window the grant was counted in (conservative)
	// tokenBucketSent: the last action sent was a token bucket.
	tokenBucketSent bool
}

// NewSession starts a stream's state.
func (s *Server) NewSession() *Session {
	return &Session{s: s, buckets: make(map[string]*bucket)}
}

// end forgets the session's buckets (their grants stay counted).
func (ss *Session) end() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.s.metrics.buckets.Sub(float64(len(ss.buckets)))
	clear(ss.buckets)
}

// Report handles one message of the stream and returns the actions to
// send (the domain comes in the first message and holds for the stream).
func (ss *Session) Report(ctx context.Context, r *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.domain == "" {
		if r.GetDomain() == "" {
			return nil, status.Error(codes.InvalidArgument, "the first usage report of a stream must name its domain")
		}
		ss.domain = r.GetDomain()
	}
	now := ss.s.opts.Now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, u := range r.GetBucketQuotaUsages() {
		id := u.GetBucketId()
		if len(id.GetBucket()) == 0 {
			return nil, status.Error(codes.InvalidArgument, "a bucket id must have at least one key")
		}
		if len(id.GetBucket()) > maxBucketKeys {
			return nil, status.Errorf(codes.InvalidArgument, "a bucket id has %d keys, more than %d", len(id.GetBucket()), maxBucketKeys)
		}
		key := canonical(id)
		b := ss.buckets[key]
		if b == nil {
			if len(ss.buckets) >= MaxBuckets {
				return nil, status.Errorf(codes.ResourceExhausted, "a stream may report %d buckets at most", MaxBuckets)
			}
			b = &bucket{id: id, interval: DefaultInterval}
			ss.buckets[key] = b
			ss.s.metrics.buckets.Inc()
		}
		ss.s.metrics.allowed.Add(float64(u.GetNumRequestsAllowed()))
		ss.s.metrics.denied.Add(float64(u.GetNumRequestsDenied()))
		resp.BucketAction = append(resp.BucketAction, ss.report(ctx, b, u, now)...)
	}
	return resp, nil
}

// report reconciles a bucket's usage and returns its next actions.
func (ss *Session) report(ctx context.Context, b *bucket, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	next := ss.nextAction(ctx, b, u, now)
	tokenBucket := next.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil
	replacing := tokenBucket && b.tokenBucketSent
	b.tokenBucketSent = tokenBucket
	if replacing {
		// Envoy does not start a token bucket that replaces another one
		// full: it keeps the one in force when the two are equal, and some
		// versions start the new one with the old one's ratio of tokens
		// left (an emptied bucket's successor starts empty). A blanket rule
		// first, in the same response, drops the old bucket: Envoy applies
		// a response's actions in order and publishes them together, so
		// no request sees it, and the grant starts full.
		return []*rlqsv3.RateLimitQuotaResponse_BucketAction{
			assignment(b.id, time.Second, blanket(typev3.RateLimitStrategy_DENY_ALL)), next}
	}
	return []*rlqsv3.RateLimitQuotaResponse_BucketAction{next}
}

// nextAction reconciles a bucket's usage and returns its next action.
func (ss *Session) nextAction(ctx context.Context, b *bucket, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	cfg := ss.s.svc.Config()
	wasLimited := b.limited
	if cfg != b.cfg {
		b.cfg = cfg
		var dom *config.Domain
		if cfg != nil {
			dom = cfg.Domain(ss.domain)
		}
		b.entries, b.limited = resolve(dom, b.id.GetBucket())
	}
	seen := u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
	if !b.lastReport.IsZero() {
		if d := now.Sub(b.lastReport); d > 0 {
			b.interval = d
			b.rate = float64(seen) / d.Seconds()
		}
	} else if b.limited {
		// A new bucket, reported at once: its rate is not known yet. Start
		// from a quarter of the tightest limit's.
		b.rate = fullRate(b.cfg.Domain(ss.domain).Match(b.entries)) / 4
	}
	b.lastReport = now

	if !b.limited {
		if wasLimited {
			ss.settle(ctx, b, u.GetNumRequestsAllowed(), now)
			ss.s.metrics.sent[actionAbandon].Inc()
			return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
		}
		ss.s.metrics.sent[actionAllowAll].Inc()
		return assignment(b.id, unlimitedTTL, blanket(typev3.RateLimitStrategy_ALLOW_ALL))
	}
	ss.settle(ctx, b, u.GetNumRequestsAllowed(), now)

	// The next grant: what the client asks for until it reports again,
	// with room for a late report (TTLs are whole seconds: one under a
	// second expires at once).
	nominal := max(wholeSeconds(b.interval+b.interval/2), time.Second)
	granted, reset := ss.take(ctx, b, need(b.rate, nominal))
	if granted == 0 {
		ss.s.metrics.sent[actionDenyAll].Inc()
		return assignment(b.id, max(wholeSecondsUp(reset), time.Second), blanket(typev3.RateLimitStrategy_DENY_ALL))
	}
	// A grant is spent within its window: its assignment ends by then.
	// One given less than a second before the window ends lasts a second,
	// and spills into the next window (the README's bound).
	ttl := max(min(nominal, wholeSeconds(reset)), time.Second)
	if n := need(b.rate, ttl); ttl < nominal && n < granted && ss.landsBefore(now, now.Add(reset)) {
		ss.request(ctx, b, granted-n, true) // what it cannot spend before it expires
		granted = n
	}
	b.grant, b.grantEnd = granted, now.Add(reset)
	ss.s.metrics.sent[actionTokenBucket].Inc()
	ss.s.metrics.granted.Add(float64(granted))
	return assignment(b.id, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(granted, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(1),
		// No fill before the assignment expires: the grant is all.
		FillInterval: durationpb.New(ttl + time.Second),
	}}})
}

// settle reconciles the grant in force with the requests the client
// allowed under it: the unused part goes back to the store while its
// window lasts; use beyond it (before a first assignment, or after one
// expired under an ALLOW_ALL fallback) is charged when it fits.
func (ss *Session) settle(ctx context.Context, b *bucket, allowed uint64, now time.Time) {
	grant := b.grant
	b.grant = 0
	switch {
	case allowed < grant:
		if ss.landsBefore(now, b.grantEnd) {
			if _, err := ss.request(ctx, b, grant-allowed, true); err == nil {
				ss.s.metrics.givenBack.Add(float64(grant - allowed))
			}
		}
	case allowed > grant:
		over := allowed - grant
		ss.s.metrics.overuse.Add(float64(over))
		if resp, err := ss.request(ctx, b, over, false); err != nil || resp.Code != service.OK {
			ss.s.metrics.overuseNot.Add(float64(over))
		}
	}
}

// landsBefore reports whether a give-back sent at now is surely decided
// before end, the end of the window its hits were counted in: one that
// landed in the next window would free hits of that window.
func (ss *Session) landsBefore(now, end time.Time) bool {
	return now.Add(2*ss.s.opts.StoreTimeout + time.Millisecond).Before(end)
}

// take asks the store for want requests of b's limits, and for less when
// that does not fit: at most half of what the binding limit has left. It
// returns what was granted and the binding limit's reset.
func (ss *Session) take(ctx context.Context, b *bucket, want uint64) (uint64, time.Duration) {
	resp, err := ss.request(ctx, b, want, false)
	if err != nil || resp == nil {
		return 0, time.Second
	}
	st := &resp.Statuses[0]
	if resp.Code == service.OK {
		return want, st.ResetAfter
	}
	// Denied: Remaining is what the binding limit has left, ResetAfter
	// when the window turns (the retry instant of a window's denial).
	left := uint64(st.Remaining)
	if left == 0 {
		return 0, st.ResetAfter
	}
	want = (left + 1) / 2
	if resp, err = ss.request(ctx, b, want, false); err != nil || resp.Code != service.OK {
		return 0, st.ResetAfter
	}
	return want, resp.Statuses[0].ResetAfter
}

// need is what a client seeing rate requests a second uses over d.
func need(rate float64, d time.Duration) uint64 {
	return max(uint64(math.Ceil(rate*d.Seconds())), 1)
}

// fullRate is the requests per second that the tightest limit of node
// admits.
func fullRate(node *config.Descriptor) float64 {
	r := math.Inf(1)
	for _, l := range node.Limits {
		if l.Rule != nil && l.Rule.Window > 0 {
			r = min(r, float64(l.Rule.Capacity())/l.Rule.Window.Seconds())
		}
	}
	if math.IsInf(r, 1) {
		return 0
	}
	return r
}

// request sends hits of b's descriptor to the service (a refund gives
// them back).
func (ss *Session) request(ctx context.Context, b *bucket, hits uint64, refund bool) (*service.Response, error) {
	return ss.s.svc.ShouldRateLimit(ctx, &service.Request{Domain: ss.domain, Descriptors: []service.Descriptor{
		{Entries: b.entries, HasHits: true, Hits: hits, Refund: refund}}})
}

func assignment(id *rlqsv3.BucketId, ttl time.Duration, strategy *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy:    strategy,
		}}}
}

func blanket(rule typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
}

// wholeSeconds rounds d down to whole seconds; wholeSecondsUp up.
func wholeSeconds(d time.Duration) time.Duration { return d.Truncate(time.Second) }
func wholeSecondsUp(d time.Duration) time.Duration {
	return (d + time.Second - 1).Truncate(time.Second)
}

// canonical is a bucket id's keys and values, sorted, as one string.
func canonical(id *rlqsv3.BucketId) string {
	keys := make([]string, 0, len(id.GetBucket()))
	for k := range id.GetBucket() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(id.GetBucket()[k])
		b.WriteByte(0)
	}
	return b.String()
}

// resolve finds the descriptor path of dom whose keys are exactly the
// bucket's, matched from the top as descriptors are, and returns its
// entries in path order and whether that node has limits.
func resolve(dom *config.Domain, bucket map[string]string) ([]config.Entry, bool) {
	if dom == nil {
		return nil, false
	}
	keys := make([]string, 0, len(bucket))
	for k := range bucket {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var path []config.Entry
	var walk func(used []bool) bool
	walk = func(used []bool) bool {
		if len(path) == len(keys) {
			n := dom.Match(path)
			return n != nil && len(n.Limits) > 0
		}
		for i, k := range keys {
			if used[i] {
				continue
			}
			path = append(path, config.Entry{Key: k, Value: bucket[k]})
			if dom.Match(path) != nil {
				used[i] = true
				if walk(used) {
					return true
				}
				used[i] = false
			}
			path = path[:len(path)-1]
		}
		return false
	}
	if walk(make([]bool, len(keys))) {
		return slices.Clone(path), true
	}
	return nil, false
}
