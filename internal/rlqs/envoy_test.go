package rlqs

import (
	"context"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// envoy emulates the rate_limit_quota filter of one Envoy on a test clock,
// from Envoy's docs and source (source/extensions/filters/http/
// rate_limit_quota/: filter.cc, global_client_impl.cc,
// filter_persistence.cc):
//   - a request's bucket that the filter has not seen is reported at once
//     (its first request is decided by no_assignment_behavior: here
//     ALLOW_ALL, the filter's default);
//   - every bucket is reported on each tick of the reporting interval, with
//     the requests allowed and denied since the last report and a
//     time_elapsed in whole seconds;
//   - an assignment's TTL is kept in whole seconds: under a second it
//     expires at once; an expired assignment falls back to
//     expired_assignment_behavior, here DENY_ALL (the config that the
//     README's bound assumes);
//   - a token bucket assignment refills tokens_per_fill every
//     fill_interval (whole seconds) up to max_tokens; one equal to the token
//     bucket in force (max_tokens, tokens_per_fill and the nanos of
//     fill_interval: what global_client_impl.cc compares) does not replace
//     it: the bucket in force carries on with its tokens; a new one starts
//     full, or, in Envoy versions that do so (replaceKeepsRatio), with the
//     ratio of tokens to max_tokens that the replaced one had;
//   - an action for a bucket the filter does not have is skipped; an
//     abandon action drops the bucket (back to no_assignment_behavior).
type envoy struct {
	session  reporter
	interval time.Duration
	buckets  map[string]*envoyBucket
	lastTick time.Time
	// replaceKeepsRatio: a token bucket replacing one starts with the old
	// one's ratio of tokens left (later Envoy versions), not full.
	replaceKeepsRatio bool
}

type envoyBucket struct {
	id              *rlqsv3.BucketId
	allowed, denied uint64
	lastReport      time.Time
	assigned        bool
	expires         time.Time
	blanketDeny     bool
	bucket          bool // a token bucket strategy
	strategy        *typev3.TokenBucket
	tokens, max     uint64
	perFill         uint64
	fillEvery       time.Duration
	lastFill        time.Time
}

// reporter is the RLQS server as a client sees it: a Session, or a gRPC
// stream (streamReporter).
type reporter interface {
	Report(context.Context, *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error)
}

// streamReporter reports over a gRPC stream: every report of a bucket
// gets an answer (the server answers each one that has buckets).
type streamReporter struct {
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
}

func (r streamReporter) Report(_ context.Context, reports *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	if err := r.stream.Send(reports); err != nil {
		return nil, err
	}
	return r.stream.Recv()
}

// newEnvoy returns an Envoy of s whose reporting ticks fall at firstTick
// and every interval after it.
func newEnvoy(s *Server, interval time.Duration, firstTick time.Time) *envoy {
	return newEnvoyOf(s.NewSession(), interval, firstTick)
}

func newEnvoyOf(r reporter, interval time.Duration, firstTick time.Time) *envoy {
	return &envoy{session: r, interval: interval, buckets: map[string]*envoyBucket{}, lastTick: firstTick.Add(-interval)}
}

// request decides one request of the bucket id at now.
func (e *envoy) request(ctx context.Context, domain string, id map[string]string, now time.Time) bool {
	key := canonical(&rlqsv3.BucketId{Bucket: id})
	b := e.buckets[key]
	if b == nil {
		b = &envoyBucket{id: &rlqsv3.BucketId{Bucket: id}, lastReport: now}
		e.buckets[key] = b
		b.allowed++ // no_assignment_behavior: ALLOW_ALL
		e.send(ctx, domain, []*envoyBucket{b}, now)
		return true
	}
	ok := b.decide(now)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	return ok
}

func (b *envoyBucket) decide(now time.Time) bool {
	switch {
	case !b.assigned:
		return true // no_assignment_behavior
	case !now.Before(b.expires):
		return false // expired_assignment_behavior: DENY_ALL
	case !b.bucket:
		return !b.blanketDeny
	}
	b.refill(now)
	if b.tokens == 0 {
		return false
	}
	b.tokens--
	return true
}

// refill adds the token bucket's fills up to now.
func (b *envoyBucket) refill(now time.Time) {
	if b.fillEvery > 0 {
		for now.Sub(b.lastFill) >= b.fillEvery {
			b.tokens = min(b.max, b.tokens+b.perFill)
			b.lastFill = b.lastFill.Add(b.fillEvery)
		}
	}
}

// tick reports every bucket when the interval has passed.
func (e *envoy) tick(ctx context.Context, domain string, now time.Time) {
	if now.Sub(e.lastTick) < e.interval {
		return
	}
	e.lastTick = now
	all := make([]*envoyBucket, 0, len(e.buckets))
	for _, b := range e.buckets {
		all = append(all, b)
	}
	e.send(ctx, domain, all, now)
}

// send reports buckets and applies the answer.
func (e *envoy) send(ctx context.Context, domain string, bs []*envoyBucket, now time.Time) {
	if len(bs) == 0 {
		return
	}
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	for _, b := range bs {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           b.id,
			TimeElapsed:        durationpb.New(now.Sub(b.lastReport).Truncate(time.Second)),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	resp, err := e.session.Report(ctx, r)
	if err != nil {
		panic(err)
	}
	for _, a := range resp.GetBucketAction() {
		b := e.buckets[canonical(a.GetBucketId())]
		if b == nil {
			continue // an action for a bucket it does not have: skipped
		}
		if a.GetAbandonAction() != nil {
			delete(e.buckets, canonical(a.GetBucketId()))
			continue
		}
		q := a.GetQuotaAssignmentAction()
		ttl := q.GetAssignmentTimeToLive().AsDuration().Truncate(time.Second)
		inForce := b.strategy
		if b.assigned && !now.Before(b.expires) {
			inForce = nil // expired: the fallback (a blanket rule) is in force
		}
		b.assigned, b.expires = true, now.Add(ttl)
		switch st := q.GetRateLimitStrategy(); {
		case st.GetTokenBucket() != nil:
			tb := st.GetTokenBucket()
			b.strategy = tb
			if inForce != nil && inForce.GetMaxTokens() == tb.GetMaxTokens() && inForce.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
				inForce.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos() {
				break // carried over, tokens and all
			}
			tokens := uint64(tb.GetMaxTokens())
			if e.replaceKeepsRatio && inForce != nil {
				b.refill(now)
				tokens = uint64(float64(tokens) * float64(b.tokens) / float64(b.max))
			}
			b.bucket, b.max, b.tokens = true, uint64(tb.GetMaxTokens()), tokens
			b.perFill, b.fillEvery, b.lastFill = uint64(tb.GetTokensPerFill().GetValue()), tb.GetFillInterval().AsDuration().Truncate(time.Second), now
		default:
			b.strategy = nil
			b.bucket, b.blanketDeny = false, st.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL
		}
	}
}
