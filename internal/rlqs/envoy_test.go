package rlqs

import (
	"context"
	"math"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// envoy emulates the rate_limit_quota filter of one Envoy on a test clock,
// from Envoy's docs and source (source/extensions/filters/http/
// rate_limit_quota/: filter.cc, global_client_impl.cc,
// filter_persistence.cc; source/common/common/token_bucket_impl.cc):
//   - a request's bucket that the filter has not seen is reported at once
//     (its first request is decided by no_assignment_behavior: here
//     ALLOW_ALL, the filter's default);
//   - every bucket is reported on each tick of the reporting interval, with
//     the requests allowed and denied since the last report and a
//     time_elapsed in whole seconds (Envoy reports every 5 s whatever
//     reporting_interval says);
//   - the server's messages are applied whenever they come, answers to a
//     report or not;
//   - an assignment's TTL is kept in whole seconds (the nanos are
//     dropped): under a second it expires at once; an expired assignment
//     falls back to expired_assignment_behavior, here DENY_ALL, for
//     expired_assignment_behavior_timeout (unset: 0), after which the
//     bucket goes back to no_assignment_behavior;
//   - a token bucket assignment is AtomicTokenBucketImpl: it starts full
//     and refills continuously at tokens_per_fill ÷ the whole seconds of
//     fill_interval a second, up to max_tokens; one equal to the token
//     bucket in force (max_tokens, tokens_per_fill and the nanos of
//     fill_interval: what global_client_impl.cc compares) does not replace
//     it: the bucket in force carries on with its tokens; a new one starts
//     full, or, in Envoy versions that do so (replaceKeepsRatio), with the
//     ratio of tokens to max_tokens that the replaced one had;
//   - an action for a bucket the filter does not have is skipped; an
//     abandon action drops the bucket (back to no_assignment_behavior).
//
// Safe for concurrent use: a gRPC stream's messages are applied by a
// goroutine of their own (streamReporter).
type envoy struct {
	mu       sync.Mutex
	session  reporter
	interval time.Duration
	buckets  map[string]*envoyBucket
	lastTick time.Time
	// replaceKeepsRatio: a token bucket replacing one starts with the old
	// one's ratio of tokens left (later Envoy versions), not full.
	replaceKeepsRatio bool
	// expiredTimeout is expired_assignment_behavior_timeout (the shipped
	// example's by default).
	expiredTimeout time.Duration
	// lie, when not nil, turns the usage counted into the usage reported:
	// a client that spends its assignments as Envoy does but reports
	// something else.
	lie func(allowed, denied uint64) (uint64, uint64)
	// mostTokens is the largest max_tokens of the token buckets it was
	// assigned (the README's bound is in their terms).
	mostTokens uint32
}

// exampleExpiredTimeout is envoy/envoy-rlqs.yaml's
// expired_assignment_behavior_timeout.
const exampleExpiredTimeout = time.Minute

type envoyBucket struct {
	id              *rlqsv3.BucketId
	allowed, denied uint64
	lastReport      time.Time

	// The action in force: none (no_assignment_behavior), a blanket rule
	// or a token bucket, until expires; then the fallback until
	// fallbackEnds.
	assigned     bool
	expires      time.Time
	fallback     bool // the expired assignment's fallback (DENY_ALL) is in force
	fallbackEnds time.Time
	blanketDeny  bool
	strategy     *typev3.TokenBucket // the token bucket action in force, nil for a blanket rule
	tb           tokenBucket
}

// tokenBucket is Envoy's AtomicTokenBucketImpl: tokens refilled
// continuously at rate a second up to max.
type tokenBucket struct {
	max, rate, tokens float64
	last              time.Time
}

func (tb *tokenBucket) refill(now time.Time) {
	if d := now.Sub(tb.last); d > 0 {
		tb.tokens = min(tb.max, tb.tokens+tb.rate*d.Seconds())
		tb.last = now
	}
}

// reporter is the RLQS server as a client sees it: a Session, or a gRPC
// stream (streamReporter). Report returns the answer when it has one at
// once; a stream's come on their own.
type reporter interface {
	Report(context.Context, *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error)
}

// pusher is a reporter whose server also sends messages of its own between
// reports: Tick returns them (a Session).
type pusher interface {
	Tick(context.Context) (*rlqsv3.RateLimitQuotaResponse, error)
}

// newEnvoy returns an Envoy of s whose reporting ticks fall at firstTick
// and every interval after it.
func newEnvoy(s *Server, interval time.Duration, firstTick time.Time) *envoy {
	return newEnvoyOf(s.NewSession(), interval, firstTick)
}

func newEnvoyOf(r reporter, interval time.Duration, firstTick time.Time) *envoy {
	return &envoy{session: r, interval: interval, buckets: map[string]*envoyBucket{},
		lastTick: firstTick.Add(-interval), expiredTimeout: exampleExpiredTimeout}
}

// request decides one request of the bucket id at now.
func (e *envoy) request(ctx context.Context, domain string, id map[string]string, now time.Time) bool {
	e.mu.Lock()
	key := canonical(&rlqsv3.BucketId{Bucket: id})
	b := e.buckets[key]
	if b == nil {
		b = &envoyBucket{id: &rlqsv3.BucketId{Bucket: id}, lastReport: now}
		e.buckets[key] = b
		b.allowed++ // no_assignment_behavior: ALLOW_ALL
		e.mu.Unlock()
		e.send(ctx, domain, []*envoyBucket{b}, now)
		return true
	}
	defer e.mu.Unlock()
	ok := b.decide(now)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	return ok
}

// advance applies the expiry timers up to now.
func (b *envoyBucket) advance(now time.Time) {
	if b.assigned && !b.fallback && !now.Before(b.expires) {
		// expired_assignment_behavior: the fallback DENY_ALL, a blanket rule.
		b.fallback = true
		b.blanketDeny, b.strategy = true, nil
	}
	if b.fallback && !now.Before(b.fallbackEnds) {
		// The fallback's time is over: back to no_assignment_behavior.
		b.assigned, b.fallback, b.strategy = false, false, nil
	}
}

func (b *envoyBucket) decide(now time.Time) bool {
	b.advance(now)
	switch {
	case !b.assigned:
		return true // no_assignment_behavior: ALLOW_ALL
	case b.strategy == nil:
		return !b.blanketDeny
	}
	b.tb.refill(now)
	if b.tb.tokens < 1 {
		return false
	}
	b.tb.tokens--
	return true
}

// tick reports every bucket when the interval has passed, and applies
// what the server pushes.
func (e *envoy) tick(ctx context.Context, domain string, now time.Time) {
	if p, ok := e.session.(pusher); ok {
		resp, err := p.Tick(ctx)
		if err != nil {
			panic(err)
		}
		e.apply(resp, now)
	}
	e.mu.Lock()
	if now.Sub(e.lastTick) < e.interval {
		e.mu.Unlock()
		return
	}
	e.lastTick = now
	all := make([]*envoyBucket, 0, len(e.buckets))
	for _, b := range e.buckets {
		all = append(all, b)
	}
	e.mu.Unlock()
	e.send(ctx, domain, all, now)
}

// send reports buckets and applies the answer.
func (e *envoy) send(ctx context.Context, domain string, bs []*envoyBucket, now time.Time) {
	if len(bs) == 0 {
		return
	}
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	e.mu.Lock()
	for _, b := range bs {
		allowed, denied := b.allowed, b.denied
		if e.lie != nil {
			allowed, denied = e.lie(allowed, denied)
		}
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           b.id,
			TimeElapsed:        durationpb.New(now.Sub(b.lastReport).Truncate(time.Second)),
			NumRequestsAllowed: allowed,
			NumRequestsDenied:  denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	e.mu.Unlock()
	resp, err := e.session.Report(ctx, r)
	if err != nil {
		panic(err)
	}
	e.apply(resp, now)
}

// apply applies a message of the server at now.
func (e *envoy) apply(resp *rlqsv3.RateLimitQuotaResponse, now time.Time) {
	if resp == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range resp.GetBucketAction() {
		b := e.buckets[canonical(a.GetBucketId())]
		if b == nil {
			continue // an action for a bucket it does not have: skipped
		}
		if a.GetAbandonAction() != nil {
			delete(e.buckets, canonical(a.GetBucketId()))
			continue
		}
		b.advance(now)
		q := a.GetQuotaAssignmentAction()
		inForce := b.strategy // nil when a blanket rule (or the fallback) is in force
		if !b.assigned {
			inForce = nil
		}
		// The TTL's whole seconds: the nanos are dropped.
		b.assigned, b.fallback, b.expires = true, false, now.Add(time.Duration(q.GetAssignmentTimeToLive().GetSeconds())*time.Second)
		b.fallbackEnds = b.expires.Add(e.expiredTimeout)
		switch st := q.GetRateLimitStrategy(); {
		case st.GetTokenBucket() != nil:
			tb := st.GetTokenBucket()
			b.strategy = tb
			e.mostTokens = max(e.mostTokens, tb.GetMaxTokens())
			if inForce != nil && inForce.GetMaxTokens() == tb.GetMaxTokens() && inForce.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
				inForce.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos() {
				break // carried over, tokens and all
			}
			rate := math.Inf(1) // a fill interval under a second: Envoy divides by 0
			if s := tb.GetFillInterval().GetSeconds(); s > 0 {
				rate = float64(tb.GetTokensPerFill().GetValue()) / float64(s)
			}
			tokens := float64(tb.GetMaxTokens())
			if e.replaceKeepsRatio && inForce != nil {
				b.tb.refill(now)
				tokens = math.Floor(tokens * b.tb.tokens / b.tb.max)
			}
			b.tb = tokenBucket{max: float64(tb.GetMaxTokens()), rate: rate, tokens: tokens, last: now}
		default:
			b.strategy = nil
			b.blanketDeny = st.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL
		}
	}
}

// streamReporter reports over a gRPC stream; the server's messages are
// applied as they come by receive.
type streamReporter struct {
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
}

func (r streamReporter) Report(_ context.Context, reports *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	return &rlqsv3.RateLimitQuotaResponse{}, r.stream.Send(reports)
}

// receive applies the messages of stream to e at the instants they come,
// until the stream ends.
func receive(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, e *envoy) {
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		e.apply(resp, time.Now())
	}
}

// overBound is what the README lets e's client be admitted above a limit in
// one window: the most tokens it could hold over from the window before
// (its assignments' max_tokens, and one for rounding), and its first
// request, admitted before any assignment.
func (e *envoy) overBound() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return int(e.mostTokens) + 2
}
