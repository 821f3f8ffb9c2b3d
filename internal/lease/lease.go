package lease

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/grant"
)

// Options configure a Store.
type Options struct {
	// Hold is how long a slice should last at the rate this process sees
	// on its counter (default 100ms): longer takes fewer slices and holds
	// more hits away from the other processes.
	Hold time.Duration
	// Quiet is how long a counter goes without a hit before its unused
	// hits are released (default 250ms).
	Quiet time.Duration
	// StoreTimeout is the inner store's own bound on a decision once sent
	// (redisstore's Options.Timeout): a release is sent only when it is
	// surely decided before its slice's window ends.
	StoreTimeout time.Duration
	// MaxCounters bounds the counters this process keeps slices of
	// (default 100000); the others are decided in the store.
	MaxCounters int
	// Now is the clock; nil is time.Now. It must be the inner store's.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

// A slice is a grant.Grant: sized by grant.Size, released only when
// grant.ReleaseLands, its hits moved by the store's grant.Ledger.
const (
	// retryAfterError is how long a counter whose take failed waits
	// before the next one.
	retryAfterError = 100 * time.Millisecond
	// rateSpan is the least time over which a rate is measured.
	rateSpan = 10 * time.Millisecond
)

// Stats are the store's counters since it started: its grant.Ledger's,
// with the names of slices.
type Stats struct {
	SlicesTaken    uint64 // slices counted in the store
	HitsTaken      uint64 // the hits of those slices
	HitsLocal      uint64 // hits spent: admitted from slices, in process
	HitsReleased   uint64 // unused hits released to the store (landed)
	HitsReleasing  uint64 // unused hits of releases in flight
	SlicesLapsed   uint64 // slices (or releases) whose unused hits lapsed
	HitsLapsed     uint64 // their hits: held when the window ended, a limit lowered, a reset, or a release failed
	TakeErrors     uint64 // takes that failed (nothing held)
	HitsHeld       uint64 // unused hits held now
	CountersLeased uint64 // counters with a slice record now
}

// Store is an engine.Store that decides leased limits from slices and
// everything else in its inner store. Safe for concurrent use; Close
// releases what it holds.
type Store struct {
	inner engine.Store
	opts  Options
	log   *slog.Logger

	mu       sync.RWMutex
	counters map[counterKey]*counter // guarded by mu

	// run runs a take or a release: in a goroutine, or (tests) at once.
	run func(func())

	stop    chan struct{} // closed by Close: the sweeper ends
	closed  atomic.Bool   // no more takes; requests go to the inner store
	spawnMu sync.Mutex    // orders spawn's Add before Close's Wait
	work    sync.WaitGroup

	ledger     grant.Ledger // every move of the slices' hits
	takeErrors atomic.Uint64
}

var _ engine.Store = (*Store)(nil)

// counterKey is a counter's identity, as stores key their states.
type counterKey struct{ desc, id string }

// counter is this process's slice of one leased counter, and what it
// knows of the counter. Guarded by mu.
type counter struct {
	mu   sync.Mutex
	desc string
	// rule is the rule of the last request decided on the counter
	// (follow): the one slices are taken, sized and released under. The
	// rules of one record share its ID, so they differ at most in limit and
	// burst.
	rule *engine.Rule

	grant      grant.Grant // the slice: unused hits held, and until when
	sliceReset time.Time   // the counter's reset as its slice's take said it: what the slice's answers report
	reset      time.Time   // the counter's reset as the store last said it (Result.Reset)

	gone     bool // forgotten by the store (sweep): no longer used
	lastHit  time.Time
	lastSize uint64 // the last slice taken
	taking   bool   // a take in flight
	backoff  time.Time

	// What the store said remains, and until when that holds (the window's
	// end, for a window; for a bucket, the reply's instant plus Hold).
	remaining      uint64
	remainingUntil time.Time

	// The rate of hits this process sees: seen since rateFrom, and the
	// estimate (hits per second).
	seen     uint64
	rateFrom time.Time
	rate     float64
}

// New returns a Store deciding leased limits from slices of inner's
// counters. inner must be the store that the other processes share.
func New(inner engine.Store, opts Options) *Store { return newStore(inner, opts, true) }

// newStore is New; without sweeper (tests), sweep is called by hand.
func newStore(inner engine.Store, opts Options, sweeper bool) *Store {
	if opts.Hold <= 0 {
		opts.Hold = 100 * time.Millisecond
	}
	if opts.Quiet <= 0 {
		opts.Quiet = 250 * time.Millisecond
	}
	if opts.MaxCounters <= 0 {
		opts.MaxCounters = 100_000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{inner: inner, opts: opts, log: opts.Logger, counters: make(map[counterKey]*counter), stop: make(chan struct{})}
	s.run = func(f func()) { go f() }
	if sweeper {
		s.work.Add(1)
		go s.sweeper()
	}
	return s
}

// spawn runs f (a take or a release) unless the store is closing, and
// reports whether it does.
func (s *Store) spawn(f func()) bool {
	s.spawnMu.Lock()
	defer s.spawnMu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.work.Add(1)
	s.run(func() {
		defer s.work.Done()
		f()
	})
	return true
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	n := len(s.counters)
	s.mu.RUnlock()
	c := s.ledger.Counts()
	return Stats{
		SlicesTaken: c.Grants, HitsTaken: c.Taken, HitsLocal: c.Spent, HitsReleased: c.Released,
		HitsReleasing: c.Releasing, SlicesLapsed: c.Lapses, HitsLapsed: c.Lapsed,
		TakeErrors: s.takeErrors.Load(), HitsHeld: c.Held, CountersLeased: uint64(n),
	}
}

// Close releases every unused hit it can (within the inner store's
// timeouts) and waits for the takes in flight. The inner store stays open:
// its owner closes it after. Later requests are all decided in the inner
// store.
func (s *Store) Close() error {
	s.spawnMu.Lock()
	done := s.closed.Swap(true)
	s.spawnMu.Unlock()
	if done {
		return nil
	}
	close(s.stop)
	s.work.Wait() // the sweeper, the takes and releases in flight
	now := s.opts.Now()
	var wg sync.WaitGroup
	for _, c := range s.all() {
		c.mu.Lock()
		hits, rule := s.release(c, now), c.rule
		c.mu.Unlock()
		if hits > 0 {
			wg.Go(func() { s.sendRelease(c, rule, hits) })
		}
	}
	wg.Wait()
	return nil
}

// Apply implements engine.Store.
func (s *Store) Apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	leased, grouped := false, false
	for i := range items {
		leased = leased || items[i].Rule.Lease
		grouped = grouped || items[i].Group != 0
	}
	if !leased || s.closed.Load() {
		return s.inner.Apply(ctx, items, results)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	now := s.opts.Now()
	// counters[i] is items[i]'s counter record when it is leased; held[i]
	// that same record when its slice covers the item.
	var buf [16]*counter
	cs := buf[:0]
	if 2*len(items) > len(buf) {
		cs = make([]*counter, 0, 2*len(items))
	}
	counters, held := cs[:len(items)], cs[len(items):2*len(items)]
	rest := 0 // items for the inner store
	for i := range items {
		it := &items[i]
		counters[i], held[i] = nil, nil
		var c *counter
		if it.Rule.Lease {
			c = s.counter(it, now)
		}
		if c == nil {
			rest++
			continue
		}
		c.mu.Lock()
		if c.gone { // forgotten since the lookup: decided in the store
			c.mu.Unlock()
			rest++
			continue
		}
		counters[i] = c
		s.follow(c, it.Rule, now)
		c.seen += it.Hits
		c.lastHit = now
		if !grouped && !it.Refund && s.spend(c, it.Hits, now) {
			// Answered from the slice as it is now: its window, and what it
			// holds (never more than remains across processes).
			held[i] = c
			results[i] = engine.Result{Admitted: true, Remaining: c.grant.Left(), Reset: max(c.sliceReset.Sub(now), 0)}
		} else {
			rest++
		}
		s.maybeTake(c, now)
		c.mu.Unlock()
	}

	admitted := true
	if rest > 0 {
		var err error
		if admitted, err = s.applyRest(ctx, items, results, counters, held, rest, now); err != nil {
			s.unspend(items, held, false)
			return false, err
		}
	}
	if !admitted {
		s.unspend(items, held, true)
	}
	return admitted, nil
}

// applyRest decides in the inner store the items that held does not
// cover (rest of them), writes their results, and tells their counters
// what the store said.
func (s *Store) applyRest(ctx context.Context, items []engine.Item, results []engine.Result, counters, held []*counter, rest int, sent time.Time) (bool, error) {
	subItems, subResults, idx := items, results, []int(nil)
	if rest < len(items) {
		subItems, subResults, idx = make([]engine.Item, 0, rest), make([]engine.Result, rest), make([]int, 0, rest)
		for i := range items {
			if held[i] == nil {
				subItems, idx = append(subItems, items[i]), append(idx, i)
			}
		}
	}
	admitted, err := s.inner.Apply(ctx, subItems, subResults)
	if err != nil {
		return false, err
	}
	for j := range subItems {
		i := j
		if idx != nil {
			i = idx[j]
			results[i] = subResults[j]
		}
		if c := counters[i]; c != nil && !items[i].Refund {
			c.mu.Lock()
			s.heard(c, &results[i], items[i].Rule, sent)
			s.maybeTake(c, s.opts.Now())
			c.mu.Unlock()
		}
	}
	return admitted, nil
}

// unspend puts the hits spent on held back into their slices: all of
// them on an error, those that do not count when denied on a denial.
func (s *Store) unspend(items []engine.Item, held []*counter, denied bool) {
	for i, c := range held {
		if c == nil || (denied && items[i].CountDenied) {
			continue
		}
		c.mu.Lock()
		s.ledger.Unspend(&c.grant, items[i].Hits)
		c.mu.Unlock()
	}
}

// Peek implements engine.Store: the inner store's dry run, in which an
// item that this process's slice covers admits, and its remaining counts
// the slice.
func (s *Store) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	admitted, err := s.inner.Peek(ctx, items, results)
	if err != nil {
		return false, err
	}
	now := s.opts.Now()
	changed := false
	for i := range items {
		it := &items[i]
		if !it.Rule.Lease || it.Group != 0 || it.Refund {
			continue
		}
		held, _ := s.Held(it.Desc, it.Rule, now)
		r := &results[i]
		r.Remaining += held
		if !r.Admitted && held >= it.Hits && held > 0 {
			r.Admitted, r.Never, r.RetryAfter = true, false, 0
			changed = true
		}
	}
	if changed {
		admitted, _ = engine.Admit(items, results)
	}
	return admitted, nil
}

// Held returns the unused hits this process holds of the counter of
// (desc, rule) and for how long it may still spend them.
func (s *Store) Held(desc string, rule *engine.Rule, now time.Time) (uint64, time.Duration) {
	c := s.lookup(desc, rule)
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if lowered(c.rule, rule) {
		return 0, 0 // not to be spent under rule (follow)
	}
	return c.grant.Held(now) // nothing once its time is over
}

// lookup returns the counter record of (desc, rule), or nil.
func (s *Store) lookup(desc string, rule *engine.Rule) *counter {
	s.mu.RLock()
	c := s.counters[counterKey{desc, rule.ID}]
	s.mu.RUnlock()
	return c
}

// all returns the counter records.
func (s *Store) all() []*counter {
	s.mu.RLock()
	defer s.mu.RUnlock()
	all := make([]*counter, 0, len(s.counters))
	for _, c := range s.counters {
		all = append(all, c)
	}
	return all
}

// counter returns the counter record of it, made if need be; nil when
// MaxCounters are kept.
func (s *Store) counter(it *engine.Item, now time.Time) *counter {
	if c := s.lookup(it.Desc, it.Rule); c != nil {
		return c
	}
	k := counterKey{it.Desc, it.Rule.ID}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.counters[k]; c != nil {
		return c
	}
	if len(s.counters) >= s.opts.MaxCounters {
		return nil
	}
	c := &counter{desc: it.Desc, rule: it.Rule, rateFrom: now}
	c.grant.Tokens = tokens(c)
	s.counters[k] = c
	return c
}

// tokens reports whether c's rule refills (a token bucket), whose slices
// live for a time rather than a window.
func tokens(c *counter) bool { return c.rule.Refills() }

// spend takes hits from c's slice when it covers them at now (a slice
// whose time is over expires first). c.mu held.
func (s *Store) spend(c *counter, hits uint64, now time.Time) bool {
	s.expire(c, now)
	return s.ledger.Spend(&c.grant, now, hits)
}

// expire ends c's slice when its time is over at now: a bucket's tokens
// are released, a window's hits lapse with it. c.mu held.
func (s *Store) expire(c *counter, now time.Time) {
	s.releaseLater(c, s.ledger.Expire(&c.grant, now))
}

// release empties c's slice for a release sent at now and returns its
// hits, or 0 when it could land after the slice's window (the hits then
// stay held until it ends, and lapse). c.mu held.
func (s *Store) release(c *counter, now time.Time) uint64 {
	return s.ledger.Release(&c.grant, now, s.opts.StoreTimeout)
}

// releaseLater sends a release of hits emptied from c's slice in the
// background; when the store is closing, they go back to the slice for
// Close to release. c.mu held.
func (s *Store) releaseLater(c *counter, hits uint64) {
	rule := c.rule
	if hits > 0 && !s.spawn(func() { s.sendRelease(c, rule, hits) }) {
		s.ledger.Keep(&c.grant, hits)
	}
}

// sendRelease refunds hits of c's counter in the inner store, under rule:
// the rule, of those they were taken under, that admits the most, so that
// a bucket gets back no more tokens than were taken.
func (s *Store) sendRelease(c *counter, rule *engine.Rule, hits uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), max(s.opts.StoreTimeout, 10*time.Millisecond))
	defer cancel()
	items := [1]engine.Item{{Desc: c.desc, Rule: rule, Hits: hits, Refund: true}}
	var res [1]engine.Result
	_, err := s.inner.Apply(ctx, items[:], res[:])
	s.ledger.Landed(hits, err == nil)
	if err != nil {
		s.log.Debug("lease: releasing a slice failed", "error", err)
	}
}

// heard records what the store said of c's counter in r, a decision
// under rule sent at sent: what remains is c.rule's. c.mu held.
func (s *Store) heard(c *counter, r *engine.Result, rule *engine.Rule, sent time.Time) {
	c.remaining = rescale(r.Remaining, rule, c.rule)
	c.reset = sent.Add(r.Reset)
	if tokens(c) {
		c.remainingUntil = sent.Add(s.opts.Hold)
	} else {
		c.remainingUntil = c.reset
	}
}

// maybeTake starts a take for c when its slice is low and the rate and
// what remains make one worth it. c.mu held.
func (s *Store) maybeTake(c *counter, now time.Time) {
	if c.taking || s.closed.Load() || now.Before(c.backoff) || c.grant.Left() > c.lastSize/2 {
		return
	}
	if d := now.Sub(c.rateFrom); d >= rateSpan {
		r := float64(c.seen) / d.Seconds()
		if c.rate == 0 {
			c.rate = r
		} else {
			c.rate = (c.rate + r) / 2
		}
		c.seen, c.rateFrom = 0, now
	}
	size := s.sliceSize(c, now)
	if size == 0 {
		return
	}
	rule := c.rule
	c.taking = s.spawn(func() { s.take(c, rule, size) })
}

// sliceSize is the slice to take for c at now (grant.Size): what
// lasts Hold at its rate, or the window's rest, within a share of what
// remains (or the rule's capacity); 0 when none is worth taking. c.mu
// held.
func (s *Store) sliceSize(c *counter, now time.Time) uint64 {
	span := s.opts.Hold
	if !tokens(c) && now.Before(c.reset) {
		span = min(span, c.reset.Sub(now))
	}
	remaining := c.rule.Capacity()
	if now.Before(c.remainingUntil) {
		remaining = min(remaining, c.remaining)
	}
	return grant.Size(c.rate, span, remaining)
}

// take asks the inner store for a slice of size hits of c's counter under
// rule and holds what it grants, unless c's rule admits less by then
// (follow): the slice is then released, or lapses.
func (s *Store) take(c *counter, rule *engine.Rule, size uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), max(4*s.opts.StoreTimeout, 50*time.Millisecond))
	defer cancel()
	sent := s.opts.Now()
	items := [1]engine.Item{{Desc: c.desc, Rule: rule, Hits: size}}
	var res [1]engine.Result
	ok, err := s.inner.Apply(ctx, items[:], res[:])
	now := s.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.taking = false
	if err != nil {
		c.backoff = now.Add(retryAfterError)
		s.takeErrors.Add(1)
		s.log.Debug("lease: taking a slice failed", "error", err)
		return
	}
	s.heard(c, &res[0], rule, sent)
	if !ok {
		return // less remains than asked: the next take sizes by it
	}
	until := grant.End(sent, res[0].Reset)
	if tokens(c) {
		until = sent.Add(2*s.opts.Hold - grant.Margin)
	}
	if lowered(rule, c.rule) {
		// Taken under a rule that admits more than the counter's now:
		// released at once, or lapses.
		g := grant.Grant{Tokens: c.grant.Tokens}
		s.ledger.Take(&g, now, size, until)
		s.releaseOrLapse(&g, c, rule, now)
		return
	}
	if held, _ := c.grant.Held(now); held == 0 {
		c.sliceReset = c.reset // the window of this take (a merged slice keeps its own)
	}
	s.releaseLater(c, s.ledger.Take(&c.grant, now, size, until))
	c.lastSize = size
}

// follow makes rule, the one a request on c's counter is decided under,
// c's rule: a reload, or anything else that changes a limit, applies to
// the next slice, which is taken and sized under it. When rule admits less
// than c's rule did (a lower limit or burst), the slice held is not spent
// under it: its hits are released, under the rule they were taken under,
// when that surely lands in their window, and otherwise lapse; requests go
// to the store, which decides them under rule, until a slice is taken
// under it. A slice taken under a rule that admits less than rule is spent
// as it is: every hit of it was counted within a smaller limit. c.mu held.
func (s *Store) follow(c *counter, rule *engine.Rule, now time.Time) {
	old := c.rule
	if rule == old {
		return
	}
	c.rule = rule
	c.remaining = rescale(c.remaining, old, rule)
	if !lowered(old, rule) || c.grant.Left() == 0 {
		return
	}
	s.releaseOrLapse(&c.grant, c, old, now)
}

// releaseOrLapse releases what g, a slice of c's counter taken under
// rule, holds when that surely lands in its window, and lets it lapse
// otherwise (or when the store is closing: lapsed rather than held).
// c.mu held.
func (s *Store) releaseOrLapse(g *grant.Grant, c *counter, rule *engine.Rule, now time.Time) {
	if hits := s.ledger.Release(g, now, s.opts.StoreTimeout); hits > 0 && !s.spawn(func() { s.sendRelease(c, rule, hits) }) {
		s.ledger.Landed(hits, false)
	}
	s.ledger.Lapse(g) // too near its window's end for a release
}

// lowered reports whether rule admits less than old, a rule of the same
// counter (the same ID: the same algorithm and window): a lower limit, or a
// lower capacity (a token bucket's burst).
func lowered(old, rule *engine.Rule) bool {
	return rule != old && (rule.Limit < old.Limit || rule.Capacity() < old.Capacity())
}

// rescale returns what remains of a counter under rule to, when from, a
// rule of the same counter, said remaining: the counter is the same, only
// the capacity differs.
func rescale(remaining uint64, from, to *engine.Rule) uint64 {
	fc, tc := from.Capacity(), to.Capacity()
	if tc >= fc {
		return min(remaining+(tc-fc), tc)
	}
	return remaining - min(remaining, fc-tc)
}

// sweeper releases the slices of counters gone quiet, ends those whose
// time is over and forgets idle counters, until Close.
func (s *Store) sweeper() {
	defer s.work.Done()
	tick := time.NewTicker(min(s.opts.Quiet/2, 50*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.sweep(s.opts.Now())
		}
	}
}

// sweep is one round of the sweeper at now.
func (s *Store) sweep(now time.Time) {
	var idle []*counter
	for _, c := range s.all() {
		c.mu.Lock()
		held, _ := c.grant.Held(now)
		switch left := c.grant.Left(); {
		case left > held: // its time is over
			s.expire(c, now)
		case left > 0 && now.Sub(c.lastHit) >= s.opts.Quiet:
			s.releaseLater(c, s.release(c, now))
		case s.idle(c, now):
			idle = append(idle, c)
		}
		c.mu.Unlock()
	}
	if len(idle) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range idle {
		c.mu.Lock()
		if s.idle(c, now) {
			c.gone = true
			delete(s.counters, counterKey{c.desc, c.rule.ID})
		}
		c.mu.Unlock()
	}
}

// idle reports whether c holds nothing and has seen no hit for long
// enough to be forgotten. c.mu held.
func (s *Store) idle(c *counter, now time.Time) bool {
	return c.grant.Left() == 0 && !c.taking && now.Sub(c.lastHit) >= max(10*s.opts.Quiet, time.Second)
}
