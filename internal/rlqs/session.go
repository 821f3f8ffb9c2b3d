package rlqs

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rlsproject/rls/internal/config"
	grants "github.com/rlsproject/rls/internal/engine/grant"
	"github.com/rlsproject/rls/internal/service"
)

// Session is one client's stream: its domain and buckets. Safe for
// concurrent use; its clock is the server's.
type Session struct {
	s       *Server
	mu      sync.Mutex
	domain  string
	buckets map[string]*bucket // by the bucket id's canonical form
	bytes   int                // what its buckets count against MaxStreamBytes
}

// sent is the kind of the last action sent for a bucket.
type sent uint8

const (
	sentNothing sent = iota
	sentAllowAll
	sentDenyAll
	sentTokenBucket
	sentAbandon
)

// bucket is what a session knows of one of its buckets.
type bucket struct {
	id *rlqsv3.BucketId

	cfg     *config.Config     // the config the entries were resolved in
	entries []config.Entry     // ordered as the descriptor path
	node    *config.Descriptor // the entries' node in cfg; nil: no limits
	known   bool               // cfg has the stream's domain
	// limits are node's limits as the runtime overrides make them, read
	// again at each report: what assignments are sized by.
	limits []*config.Limit

	lastReport time.Time
	reports    int           // reports seen
	interval   time.Duration // between the client's reports, as seen
	rate       float64       // requests a second the client sees (allowed + denied)
	seen       uint64        // requests reported since seenSince, for the next rate
	seenSince  time.Time
	measured   bool // rate is measured, not guessed
	short      bool // the client reported denials (over 1% of its requests)
	// pressedUntil: till then the limits are short (sawLeft).
	pressedUntil time.Time
	left         uint64    // what the limits had left after the last payment,
	leftAt       time.Time // when,
	leftEnd      time.Time // and the end of its window

	sent      sent
	grant     *grant    // the token bucket in force, paid; nil when none
	denyUntil time.Time // with sentDenyAll: when the limits may have room again
	// canSpend is the most the client can have admitted under its
	// assignments since its last report (what it could hold then, and
	// what they let it spend since: grant.accrue).
	canSpend float64
}

// NewSession starts a stream's state.
func (s *Server) NewSession() *Session {
	return &Session{s: s, buckets: make(map[string]*bucket)}
}

// end forgets the session's buckets. Their grants stay counted (they
// lapse): the client may still spend them until their assignments expire.
func (ss *Session) end() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.s.opts.Now()
	for _, b := range ss.buckets {
		ss.lapse(b, now)
	}
	ss.s.metrics.buckets.Sub(float64(len(ss.buckets)))
	ss.s.bytes.Add(-int64(ss.bytes))
	clear(ss.buckets)
	ss.bytes = 0
}

// Report handles one message of the stream and returns the actions to
// send (the domain comes in the first message and holds for the stream).
func (ss *Session) Report(ctx context.Context, r *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.domain == "" {
		switch d := r.GetDomain(); {
		case d == "":
			return nil, status.Error(codes.InvalidArgument, "the first usage report of a stream must name its domain")
		case len(d) > service.MaxDomainLen:
			return nil, status.Errorf(codes.InvalidArgument, "a domain of %d bytes, longer than %d", len(d), service.MaxDomainLen)
		default:
			ss.domain = d
		}
	}
	now := ss.s.opts.Now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for i, u := range r.GetBucketQuotaUsages() {
		id := u.GetBucketId()
		if err := checkBucketID(i, id); err != nil {
			return nil, err
		}
		key := canonical(id)
		b := ss.buckets[key]
		if b == nil {
			var err error
			if b, err = ss.newBucket(id, key); err != nil {
				return nil, err
			}
		}
		// Reports are the client's word: bounded before they count.
		elapsed := max(now.Sub(b.lastReport), time.Millisecond)
		if b.lastReport.IsZero() {
			elapsed = time.Second
		}
		allowed, denied := plausible(u.GetNumRequestsAllowed(), elapsed), plausible(u.GetNumRequestsDenied(), elapsed)
		ss.s.metrics.allowed.Add(float64(allowed))
		ss.s.metrics.denied.Add(float64(denied))
		resp.BucketAction = append(resp.BucketAction, ss.report(ctx, b, allowed, denied, now)...)
	}
	return resp, nil
}

// newBucket adds the bucket id, within the bounds of a stream and of the
// server. key is its canonical form.
func (ss *Session) newBucket(id *rlqsv3.BucketId, key string) (*bucket, error) {
	if len(ss.buckets) >= MaxBuckets {
		return nil, status.Errorf(codes.ResourceExhausted, "a stream may report %d buckets at most", MaxBuckets)
	}
	n := len(key) + bucketOverhead
	if ss.bytes+n > MaxStreamBytes {
		return nil, status.Errorf(codes.ResourceExhausted, "a stream's bucket ids may hold %d bytes at most", MaxStreamBytes)
	}
	if !ss.s.claimBytes(n) {
		return nil, status.Errorf(codes.ResourceExhausted, "the RLQS streams' bucket ids hold %d bytes, the most this server keeps", MaxBytes)
	}
	ss.bytes += n
	// A copy: the message's unknown fields are not kept.
	b := &bucket{id: &rlqsv3.BucketId{Bucket: maps.Clone(id.GetBucket())}, interval: DefaultInterval}
	ss.buckets[key] = b
	ss.s.metrics.buckets.Inc()
	return b, nil
}

// checkBucketID checks the bucket id of usage i against the bounds of a
// request descriptor.
func checkBucketID(i int, id *rlqsv3.BucketId) error {
	m := id.GetBucket()
	switch {
	case len(m) == 0:
		return status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d].bucket_id: must have at least one key", i)
	case len(m) > maxBucketKeys:
		return status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d].bucket_id: %d keys, more than %d", i, len(m), maxBucketKeys)
	}
	total := 0
	for k, v := range m {
		switch {
		case k == "":
			return status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d].bucket_id: an empty key", i)
		case len(k) > service.MaxKeyLen:
			return status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d].bucket_id: a key of %d bytes, longer than %d", i, len(k), service.MaxKeyLen)
		case len(v) > service.MaxValueLen:
			return status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d].bucket_id: a value of %d bytes, longer than %d", i, len(v), service.MaxValueLen)
		}
		total += len(k) + len(v)
	}
	if total > maxBucketBytes {
		return status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d].bucket_id: %d bytes of keys and values, more than %d", i, total, maxBucketBytes)
	}
	return nil
}

// plausible bounds a number of requests that a client reports over elapsed:
// at most a million a second (a token bucket's fastest rate).
func plausible(n uint64, elapsed time.Duration) uint64 {
	return min(n, uint64(math.Ceil(elapsed.Seconds()*maxReportedRate)))
}

// maxReportedRate is the most requests a second a report may count for a
// bucket.
const maxReportedRate = 1e6

// report takes a bucket's usage into account and returns its next actions.
func (ss *Session) report(ctx context.Context, b *bucket, allowed, denied uint64, now time.Time) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	ss.resolve(b)
	first := b.lastReport.IsZero()
	if !first {
		// The client's reporting interval, from the time between its
		// reports; not the first one: a new bucket is reported at once,
		// off the client's schedule. Down by half at most per report.
		if d := now.Sub(b.lastReport); b.reports > 1 && d > 0 {
			b.interval = min(max(d, b.interval/2), maxInterval)
		}
		// The rate over rateSpan at least: a client that reports often
		// is measured over several of its reports; over a second when it
		// has no measure yet or is short of tokens.
		b.seen += allowed + denied
		if d := now.Sub(b.seenSince); d >= rateSpan || d >= time.Second && (!b.measured || denied > allowed/100) {
			b.measured = true
			b.rate = float64(b.seen) / d.Seconds()
			b.seen, b.seenSince = 0, now
		}
	} else {
		// A new bucket, reported at once: its rate is not known yet. Start
		// from an eighth of what its limits admit over guessSpan.
		if b.node != nil {
			b.rate = rateCap(b.limits, guessSpan) / 8
		}
		b.seenSince = now
	}
	b.lastReport = now
	b.reports++
	b.short = denied > allowed/100

	if b.node != nil {
		// Requests beyond what its assignments let it admit (before its
		// first one, or under a fallback) are charged when they fit.
		b.accrue(now, &ss.s.ledger)
		if most := uint64(b.canSpend); allowed > most {
			over := min(allowed-most, service.MaxHits)
			ss.s.metrics.overuse.Add(float64(over))
			if resp, err := ss.request(ctx, nil, b.entries, over, false); err != nil || resp.Code != service.OK {
				ss.s.metrics.overuseNot.Add(float64(over))
			}
		}
	}

	var actions []*rlqsv3.RateLimitQuotaResponse_BucketAction
	if b.node == nil {
		actions = ss.unlimited(ctx, b, now)
	} else {
		actions = ss.assign(ctx, b, now)
	}
	b.canSpend = 0
	if g := b.grant; g.live(now) {
		b.accrue(now, &ss.s.ledger)
		b.canSpend = float64(g.a.max) // it may hold up to max now
	}
	return actions
}

// resolve makes the bucket's entries and node those of the current config,
// and its limits those the runtime overrides make them now.
func (ss *Session) resolve(b *bucket) {
	cfg := ss.s.svc.Config()
	if cfg != b.cfg || b.cfg == nil {
		b.cfg = cfg
		var dom *config.Domain
		if cfg != nil {
			dom = cfg.Domain(ss.domain)
		}
		b.known = dom != nil
		b.entries, b.node = resolve(dom, b.id.GetBucket())
	}
	b.limits = ss.s.svc.LimitsOf(b.cfg, ss.domain, b.entries, b.node)
}

// unlimited returns the action of a bucket that names no limit: ALLOW_ALL,
// or abandon when a reload took its limits away.
func (ss *Session) unlimited(ctx context.Context, b *bucket, now time.Time) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	if b.sent == sentTokenBucket || b.sent == sentDenyAll {
		ss.release(ctx, b, now)
		b.sent = sentAbandon
		ss.s.metrics.sent[actionAbandon].Inc()
		return []*rlqsv3.RateLimitQuotaResponse_BucketAction{{BucketId: b.id,
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}}
	}
	ttl := unlimitedTTL
	if !b.known {
		// A domain the config does not have: maybe a config still to
		// come, maybe a typo. Until the next report only.
		ss.s.metrics.unknownDomain.Inc()
		ttl = b.ttl()
	}
	b.sent = sentAllowAll
	ss.s.metrics.sent[actionAllowAll].Inc()
	return []*rlqsv3.RateLimitQuotaResponse_BucketAction{quotaAction(b.id, ttl, blanket(typev3.RateLimitStrategy_ALLOW_ALL))}
}

// ttl is the time to live of the bucket's assignments: past its next
// report, late by half an interval, in whole seconds.
func (b *bucket) ttl() time.Duration {
	return max(wholeSecondsUp(b.interval+b.interval/2), time.Second)
}

// assign returns a limited bucket's next action at now: the token bucket
// in force carried on when it still fits the client's rate (and its fill
// paid to the next window boundary), else a new one, paid, else DENY_ALL
// until the limits have room again.
func (ss *Session) assign(ctx context.Context, b *bucket, now time.Time) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	ttl := b.ttl()
	g := b.grant
	if !g.live(now) || g.cfg != b.cfg {
		return ss.replace(ctx, b, b.want(now), now, nil)
	}
	ends := g.ends
	g.ends = now.Add(ttl)
	if short := ss.takeTo(ctx, b, g, now); short != nil {
		// Not extended: the token bucket in force goes on until it
		// expires, paid; a report after it gets what fits then.
		g.ends = ends
		return nil
	}
	if actions := ss.resize(ctx, b, now); actions != nil {
		return actions
	}
	ss.s.metrics.sent[actionTokenBucket].Inc()
	return []*rlqsv3.RateLimitQuotaResponse_BucketAction{quotaAction(b.id, ttl, g.a.strategy())}
}

// resize replaces the bucket's token bucket, paid to the next window
// boundary, when the rate it would be sized to now is well below its own
// (keepBelow; pressedKeep when the limits run short), or well above it
// (growAbove) while its client is short of tokens: then by a grant's share
// of what the limits had left after that payment at most (grant.Cap: a
// quarter). It returns nil when the token bucket goes on (Envoy carries an
// equal one over, with its tokens, so nothing new is paid for its max).
func (ss *Session) resize(ctx context.Context, b *bucket, now time.Time) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	g, want := b.grant, b.want(now)
	r, w, below := g.a.rate(), want.rate(), keepBelow
	if now.Before(b.pressedUntil) {
		below = pressedKeep
	}
	switch {
	case w < below*r:
		return ss.replace(ctx, b, want, now, nil)
	case b.short && w > growAbove*r:
		end := nextBoundary(b.limits, now)
		if !b.leftEnd.Equal(end) {
			// Nothing paid in this window yet: what is left is not known.
			return ss.replace(ctx, b, want, now, nil)
		}
		// The client's share of this window's rest grows by a grant's
		// share of what is left; the token bucket's own fill comes back
		// when replaced.
		span := earlier(g.ends, end).Sub(now) + burstTime
		if grown := min(w, r+float64(grants.Cap(b.left))/span.Seconds()); grown > growAbove*r {
			return ss.replace(ctx, b, sized(grown, b.limits, b.ttl()), now, nil)
		}
	}
	return nil
}

// replace ends the bucket's grant at now and returns the actions of a new
// one, of want or less, paid: after a payment that fell short (short), of
// a grant's share of what the binding limit has left (grant.Cap: a
// quarter); DENY_ALL when nothing fits.
func (ss *Session) replace(ctx context.Context, b *bucket, want assignment, now time.Time, short *shortfall) []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	replacing := b.grant.live(now)
	ss.release(ctx, b, now)
	ttl := b.ttl()
	for range 3 {
		if short != nil && errors.Is(short.err, service.ErrConfigChanged) {
			// A reload between resolving and paying: resolve again.
			ss.resolve(b)
			if b.node == nil {
				return ss.unlimited(ctx, b, now)
			}
			short = nil
		}
		if short != nil {
			if short.err != nil || short.left == 0 {
				break
			}
			// A grant's share of what is left, spent over the rest of the
			// window and the burst.
			span := earlier(now.Add(ttl), nextBoundary(b.limits, now)).Sub(now)
			share := float64(grants.Cap(short.left))
			rate := min(want.rate(), share/(span+burstTime).Seconds())
			for rate > 0 && float64(maxTokens(rate, b.limits))+rate*span.Seconds() > share {
				rate *= 0.8 // the least max_tokens may not fit
			}
			if rate*span.Seconds() < 1 {
				break // not a request before the window turns: DENY_ALL till then
			}
			want = sized(rate, b.limits, ttl)
		}
		g := &grant{a: want, start: now, ends: now.Add(ttl), cfg: b.cfg, entries: b.entries, limits: b.limits, takenUntil: now}
		short = ss.takeTo(ctx, b, g, now)
		if short == nil {
			b.grant, b.sent = g, sentTokenBucket
			ss.s.metrics.sent[actionTokenBucket].Inc()
			next := quotaAction(b.id, ttl, g.a.strategy())
			if !replacing {
				return []*rlqsv3.RateLimitQuotaResponse_BucketAction{next}
			}
			// Envoy does not start a token bucket that replaces another
			// one full: it keeps the one in force when the two are equal,
			// and some versions start the new one with the old one's ratio
			// of tokens left. A blanket rule first, in the same response,
			// drops the old bucket: Envoy applies a response's actions in
			// order and publishes them together, so no request sees it,
			// and the new bucket starts full (as paid).
			return []*rlqsv3.RateLimitQuotaResponse_BucketAction{
				quotaAction(b.id, time.Second, blanket(typev3.RateLimitStrategy_DENY_ALL)), next}
		}
	}
	// Nothing fits: DENY_ALL until the limits may have room again (a tick
	// then tries anew).
	reset := time.Second
	if short != nil {
		reset = short.reset
	}
	b.sent, b.denyUntil = sentDenyAll, now.Add(reset)
	ss.s.metrics.sent[actionDenyAll].Inc()
	return []*rlqsv3.RateLimitQuotaResponse_BucketAction{quotaAction(b.id, max(wholeSecondsUp(reset), time.Second), blanket(typev3.RateLimitStrategy_DENY_ALL))}
}

// want is the assignment the bucket's client's rate asks for.
func (b *bucket) want(now time.Time) assignment {
	h := headroom
	if now.Before(b.pressedUntil) {
		h = pressedHeadroom
	}
	return sized(b.rate*h, b.limits, b.ttl())
}

// Tick makes the payments and the changes due at the server's clock
// without a report: a window of the limits turned while a token bucket
// lasts (its fill in the new window is paid, or it is replaced by what
// fits), or a bucket denied until then may have room again. It returns
// the actions to send, none mostly.
func (ss *Session) Tick(ctx context.Context) (*rlqsv3.RateLimitQuotaResponse, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.s.opts.Now()
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, b := range ss.buckets {
		due, ok := b.due()
		if !ok || now.Before(due) {
			continue
		}
		ss.resolve(b)
		switch g := b.grant; {
		case b.node == nil:
			resp.BucketAction = append(resp.BucketAction, ss.unlimited(ctx, b, now)...)
		case b.sent == sentDenyAll:
			resp.BucketAction = append(resp.BucketAction, ss.replace(ctx, b, b.want(now), now, nil)...)
		case !g.live(now):
			ss.lapse(b, now) // expired: the client has fallen back
		default:
			if short := ss.takeTo(ctx, b, g, now); short != nil {
				resp.BucketAction = append(resp.BucketAction, ss.replace(ctx, b, g.a, now, short)...)
			} else {
				resp.BucketAction = append(resp.BucketAction, ss.resize(ctx, b, now)...)
			}
		}
	}
	return resp, nil
}

// due is when the bucket next needs the server without a report.
func (b *bucket) due() (time.Time, bool) {
	switch {
	case b.sent == sentDenyAll && b.node != nil:
		return b.denyUntil, true
	case b.grant != nil && b.grant.takenUntil.Before(b.grant.ends):
		return b.grant.takenUntil, true
	}
	return time.Time{}, false
}

// NextTick is when Tick next has something to do; false when never
// before a report.
func (ss *Session) NextTick() (time.Time, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var next time.Time
	for _, b := range ss.buckets {
		if due, ok := b.due(); ok && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	return next, !next.IsZero()
}

func quotaAction(id *rlqsv3.BucketId, ttl time.Duration, strategy *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy:    strategy,
		}}}
}

func blanket(rule typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
}

// wholeSecondsUp rounds d up to whole seconds.
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
// entries in path order and its node; nil when none has limits (an
// unlimited limit is none).
func resolve(dom *config.Domain, bucket map[string]string) ([]config.Entry, *config.Descriptor) {
	if dom == nil {
		return nil, nil
	}
	keys := make([]string, 0, len(bucket))
	for k := range bucket {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var path []config.Entry
	var found *config.Descriptor
	var walk func(used []bool) bool
	walk = func(used []bool) bool {
		if len(path) == len(keys) {
			found = dom.Match(path)
			return found != nil && limited(found)
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
		return slices.Clone(path), found
	}
	return nil, nil
}

// limited says node has a limit that counts.
func limited(node *config.Descriptor) bool {
	for _, l := range node.Limits {
		if l.Rule != nil {
			return true
		}
	}
	return false
}
