package rlqs

import (
	"context"
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/config"
	grants "github.com/rlsproject/rls/internal/engine/grant"
	"github.com/rlsproject/rls/internal/service"
)

// Sizing of assignments.
const (
	// headroom is the fill rate of an assignment over the client's rate,
	// room for its rate to swing between two reports, while the limits
	// have room; pressedHeadroom once they run short (then what a client
	// is paid and does not spend is what others lack).
	headroom        = 1.5
	pressedHeadroom = 1.0
	// burstTime is an assignment's max_tokens in time of its fill rate,
	// at most a quarter of the shortest window of its limits; minTokens
	// the least max_tokens when that fits half a window of fill: the
	// requests a client may admit at once, and, per window, what it may
	// spend in a window of tokens paid in the one before (the README's
	// bound).
	burstTime = 250 * time.Millisecond
	minTokens = 8
	// An assignment in force is kept (Envoy carries its tokens over) while
	// the rate it would be sized to now is at most growAbove × its rate,
	// and at least keepBelow × its rate (pressedKeep × when pressed).
	growAbove   = 1.1
	keepBelow   = 0.6
	pressedKeep = 0.85
	// pressHold is how long a bucket stays pressed after its limits ran
	// short.
	pressHold = 10 * time.Second
	// rateSpan is the least time a client's rate is measured over.
	rateSpan = 5 * time.Second
	// maxInterval bounds the reporting interval assumed of a client, and so
	// the time to live of its assignments.
	maxInterval = 2 * time.Minute
	// guessSpan: a new bucket's rate is guessed at an eighth of what its
	// limits admit over guessSpan.
	guessSpan = time.Minute
)

// assignment is a token bucket as Envoy runs it (AtomicTokenBucketImpl): it
// starts full, with max tokens, and refills continuously at perFill tokens
// every fillEvery (whole seconds: Envoy drops the nanos) up to max.
type assignment struct {
	max       uint32
	perFill   uint32
	fillEvery time.Duration
}

// rate is the assignment's fill rate, tokens a second.
func (a assignment) rate() float64 { return float64(a.perFill) / a.fillEvery.Seconds() }

// strategy is a as sent.
func (a assignment) strategy() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     a.max,
		TokensPerFill: wrapperspb.UInt32(a.perFill),
		FillInterval:  durationpb.New(a.fillEvery),
	}}}
}

// sized returns the assignment of limits (a bucket's, as the runtime
// overrides make them) that fills at rate (tokens a second), at most what
// they can pay over ttl (rateCap); at least one token per fill interval,
// which is a whole number of seconds.
func sized(rate float64, limits []*config.Limit, ttl time.Duration) assignment {
	limitRate := rateCap(limits, ttl)
	rate = min(rate, limitRate)
	a := assignment{perFill: 1, fillEvery: time.Second}
	switch {
	case rate >= 1:
		a.perFill = uint32(min(math.Ceil(rate), math.Floor(max(limitRate, 1)), math.MaxUint32/2))
	case rate > 0:
		a.fillEvery = time.Duration(min(math.Floor(1/rate), maxFillEvery.Seconds())) * time.Second
	default:
		a.fillEvery = maxFillEvery
	}
	if limitRate < 1 && limitRate > 0 {
		// Never faster than the limit: one token per 1 ÷ its rate.
		a.fillEvery = max(a.fillEvery, min(time.Duration(math.Ceil(1/limitRate))*time.Second, maxFillEvery))
	}
	a.max = maxTokens(a.rate(), limits)
	return a
}

// maxTokens is the max_tokens of an assignment of limits that fills at
// rate: burstTime of it, at most a quarter of the limits' shortest window;
// or minTokens when that is more and fits half a window.
func maxTokens(rate float64, limits []*config.Limit) uint32 {
	w := shortestWindow(limits)
	n := max(math.Ceil(rate*min(burstTime, w/4).Seconds()), min(minTokens, math.Ceil(rate*(w/2).Seconds())), 1)
	return uint32(min(n, math.MaxUint32))
}

// shortestWindow is the shortest window of limits (a token bucket's is
// its unit of time).
func shortestWindow(limits []*config.Limit) time.Duration {
	w := time.Duration(math.MaxInt64)
	for _, l := range limits {
		if l.Rule != nil && l.Rule.Window > 0 {
			w = min(w, l.Rule.Window)
		}
	}
	return w
}

// maxFillEvery bounds a fill interval: a slower client refills once an
// hour.
const maxFillEvery = time.Hour

// grant is what the store has been paid for the token bucket in force on a
// bucket: every token the client can spend of it is counted in the store
// before the client can spend it, in the window of its counters that it
// can be spent in (with the tokens it may hold over from the window
// before: at most max). The counters are those of the config it was paid
// in: a release goes to them or nowhere.
type grant struct {
	a       assignment
	start   time.Time // when the client's token bucket started, full
	ends    time.Time // when its assignment expires
	cfg     *config.Config
	entries []config.Entry
	limits  []*config.Limit // entries' limits in cfg, as the runtime overrides made them
	mark    time.Time       // what it let the client spend is in bucket.canSpend up to mark
	// taken is the tokens taken since start (max included), the fill
	// taken up to takenUntil.
	taken      uint64
	takenUntil time.Time
	// held is the tokens taken in the window that the last of them were
	// counted in (a Grant of package grant, which ends with the window),
	// less what the client could have spent of them: what a release can
	// give back. Tokens are spent oldest first.
	held grants.Grant
}

// owed is the most the client can have spent by t: max and the fill since
// start.
func (g *grant) owed(t time.Time) float64 {
	return float64(g.a.max) + g.a.rate()*max(t.Sub(g.start), 0).Seconds()
}

// accrue adds to b.canSpend what the grant in force let its client spend
// up to now (its fill; its max when it started), and spends from the
// grant's ledger (l) what the client could have spent of it by now.
func (b *bucket) accrue(now time.Time, l *grants.Ledger) {
	g := b.grant
	if g == nil {
		return
	}
	if g.mark.IsZero() {
		b.canSpend += float64(g.a.max)
		g.mark = g.start
	}
	if t := earlier(now, g.ends); t.After(g.mark) {
		b.canSpend += g.owed(t) - g.owed(g.mark)
		g.mark = t
	}
	// What the client cannot have spent by now, of the tokens taken: of
	// those held, the newest.
	var unspendable uint64
	if spendable := uint64(math.Floor(g.owed(now))); g.taken > spendable {
		unspendable = g.taken - spendable
	}
	if held := g.held.Left(); held > unspendable {
		l.Spend(&g.held, now, held-unspendable)
	}
}

// sawLeft takes in what the limits had left after a payment of hits at
// now, in the window that ends at end: the limits run short when that is
// less than the payment, or when the others who spend them, at their pace
// since the bucket's last payment in that window, run them out before it
// ends. Then what one client is paid and does not spend, another lacks:
// the bucket is pressed for pressHold.
func (b *bucket) sawLeft(now, end time.Time, left, hits uint64) {
	short := left < hits
	if !short && end.Equal(b.leftEnd) && now.After(b.leftAt) {
		others := float64(b.left) - float64(left+hits)
		short = others/now.Sub(b.leftAt).Seconds()*end.Sub(now).Seconds() > float64(left)
	}
	if short {
		b.pressedUntil = now.Add(pressHold)
	}
	b.left, b.leftAt, b.leftEnd = left, now, end
}

// live says the grant's assignment is in force at now.
func (g *grant) live(now time.Time) bool { return g != nil && now.Before(g.ends) }

// shortfall is why a payment was not made: the store's error, or what the
// binding limit has left and when it may have room again.
type shortfall struct {
	left  uint64
	reset time.Duration
	err   error
}

// takeTo pays the grant's fill up to min(g.ends, the next window boundary
// after now): what the client can spend by then and the store has not
// been paid yet, counted at now in the current window of the grant's
// counters. It returns nil when paid, else why not (nothing is paid then).
func (ss *Session) takeTo(ctx context.Context, b *bucket, g *grant, now time.Time) *shortfall {
	end := nextBoundary(g.limits, now)
	to := earlier(g.ends, end)
	if !to.After(g.takenUntil) {
		return nil
	}
	owed := uint64(math.Ceil(g.owed(to) - 1e-9))
	if owed <= g.taken {
		g.takenUntil = to
		return nil
	}
	hits := owed - g.taken
	resp, err := ss.request(ctx, g.cfg, g.entries, hits, false)
	if err != nil {
		return &shortfall{reset: time.Second, err: err}
	}
	st := &resp.Statuses[0]
	if resp.Code != service.OK {
		b.pressedUntil = now.Add(pressHold)
		return &shortfall{left: uint64(st.Remaining), reset: max(st.ResetAfter, time.Millisecond)}
	}
	b.sawLeft(now, end, uint64(st.Remaining), hits)
	g.taken, g.takenUntil = owed, to
	// Counted in the window that ends at end: what the grant held of the
	// window before lapses (the client had it all to spend by its end).
	ss.s.ledger.Take(&g.held, now, hits, end)
	return nil
}

// release ends the grant at now (its assignment replaced, or gone): what
// the client can no longer spend of what was paid in the current window
// goes back to the counters that took it, when that surely lands while
// the window lasts (grant.ReleaseLands); otherwise it lapses. It is the
// one place where hits go back: they are never more than what the
// client's own token bucket could not have spent, whatever it reports.
func (ss *Session) release(ctx context.Context, b *bucket, now time.Time) {
	l := &ss.s.ledger
	b.accrue(now, l)
	g := b.grant
	b.grant = nil
	if g == nil {
		return
	}
	back := l.Release(&g.held, now, ss.s.opts.StoreTimeout)
	l.Lapse(&g.held)
	if back == 0 {
		return
	}
	_, err := ss.request(ctx, g.cfg, g.entries, back, true)
	// An error (ErrConfigChanged: the counters that paid are no longer
	// the config's): the hits stay counted there until their window ends.
	l.Landed(back, err == nil)
}

// lapse ends the grant at now without a release (its assignment expired,
// its stream ended): what the client could not have spent of it lapses.
func (ss *Session) lapse(b *bucket, now time.Time) {
	b.accrue(now, &ss.s.ledger)
	if g := b.grant; g != nil {
		ss.s.ledger.Lapse(&g.held)
	}
	b.grant = nil
}

// request sends hits of entries to the service, decided in cfg or not at
// all (a refund gives them back).
func (ss *Session) request(ctx context.Context, cfg *config.Config, entries []config.Entry, hits uint64, refund bool) (*service.Response, error) {
	return ss.s.svc.ShouldRateLimit(ctx, &service.Request{Domain: ss.domain, Config: cfg, Descriptors: []service.Descriptor{
		{Entries: entries, HasHits: true, Hits: hits, Refund: refund}}})
}

// nextBoundary is the first instant after t at which a window of one of
// limits turns: a payment made before it is counted in the windows
// that hold t. Token buckets and sliding windows have no windows of their
// own: their payments are made every window length (for a token bucket,
// at most the time its burst takes to refill), so that each fits in it.
func nextBoundary(limits []*config.Limit, t time.Time) time.Time {
	at := t.UnixMicro()
	next := int64(math.MaxInt64)
	for _, l := range limits {
		if l.Rule == nil || l.Rule.Window <= 0 {
			continue
		}
		if bounds, ok := l.Rule.CalendarBounds(at); ok {
			next = min(next, bounds[2])
			continue
		}
		w := l.Rule.Window.Microseconds()
		if r := l.Rule; r.Burst > 0 && r.Burst < r.Limit { // a token bucket's
			w = max(w*int64(r.Burst)/int64(r.Limit), time.Millisecond.Microseconds())
		}
		next = min(next, (at/w+1)*w)
	}
	if next == math.MaxInt64 {
		return t.Add(time.Hour)
	}
	return time.UnixMicro(next)
}

// rateCap is the fastest rate (requests a second) at which limits can
// pay an assignment that lasts span: for each limit, its requests over
// the shorter of its window and span; the least of them. 0 when a limit
// admits nothing.
func rateCap(limits []*config.Limit, span time.Duration) float64 {
	r := math.Inf(1)
	for _, l := range limits {
		if l.Rule != nil && l.Rule.Window > 0 && !l.Shadow {
			r = min(r, float64(l.Rule.Limit)/min(l.Rule.Window, span).Seconds())
		}
	}
	if math.IsInf(r, 1) {
		return 0
	}
	return r
}

// earlier is the earlier of a and b.
func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
