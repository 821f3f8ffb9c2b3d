package lease

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// Options configure a Store.
type Options struct {
	// Hold is how long a slice should last at the rate this process sees
	// on its counter (default 100ms): longer takes fewer slices and holds
	// more hits away from the other processes.
	Hold time.Duration
	// Quiet is how long a counter goes without a hit before its unused
	// hits are given back (default 250ms).
	Quiet time.Duration
	// StoreTimeout is the inner store's own bound on a decision once sent
	// (redisstore's Options.Timeout): a give-back is sent only when it is
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

const (
	// shareDivisor: a slice is at most this fraction of what the store
	// said remains.
	shareDivisor = 4
	// minSlice is the smallest slice worth a round trip.
	minSlice = 2
	// clockMargin is taken off a slice's end for the rates of the local
	// and the store's clocks, which differ by far less.
	clockMargin = time.Millisecond
	// retryAfterError is how long a counter whose take failed waits
	// before the next one.
	retryAfterError = 100 * time.Millisecond
	// rateSpan is the least time over which a rate is measured.
	rateSpan = 10 * time.Millisecond
)

// Stats are the store's counters since it started.
type Stats struct {
	SlicesTaken    uint64 // slices counted in the store
	HitsTaken      uint64 // the hits of those slices
	HitsLocal      uint64 // hits admitted from slices, in process
	HitsGivenBack  uint64 // unused hits given back to the store
	SlicesLost     uint64 // slices whose unused hits were not given back
	HitsLost       uint64 // their hits: held when the window ended, or a give-back failed
	TakeErrors     uint64 // takes that failed (nothing held)
	HitsHeld       uint64 // unused hits held now
	CountersLeased uint64 // counters with a slice record now
}

// Store is an engine.Store that decides leased limits from slices and
// everything else in its inner store. Safe for concurrent use; Close gives
// back what it holds.
type Store struct {
	inner engine.Store
	opts  Options
	log   *slog.Logger

	mu       sync.RWMutex
	counters map[counterKey]*counter // guarded by mu

	// run runs a take or a give-back: in a goroutine, or (tests) at once.
	run func(func())

	stop    chan struct{} // closed by Close: the sweeper ends
	closed  atomic.Bool   // no more takes; requests go to the inner store
	spawnMu sync.Mutex    // orders spawn's Add before Close's Wait
	work    sync.WaitGroup

	slicesTaken, hitsTaken, hitsLocal, hitsGivenBack atomic.Uint64
	slicesLost, hitsLost, takeErrors, hitsHeld       atomic.Uint64
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
	// (follow): the one slices are taken, sized and given back under. The
	// rules of one record share its ID, so they differ at most in limit and
	// burst.
	rule *engine.Rule

	left       uint64    // unused hits held
	until      time.Time // the slice may be spent before this instant
	sliceReset time.Time // the counter's reset as its slice's take said it: what the slice's answers report
	reset      time.Time // the counter's reset as the store last said it (Result.Reset)

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

// spawn runs f (a take or a give-back) unless the store is closing, and
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
	return Stats{
		SlicesTaken: s.slicesTaken.Load(), HitsTaken: s.hitsTaken.Load(), HitsLocal: s.hitsLocal.Load(),
		HitsGivenBack: s.hitsGivenBack.Load(), SlicesLost: s.slicesLost.Load(), HitsLost: s.hitsLost.Load(),
		TakeErrors: s.takeErrors.Load(), HitsHeld: s.hitsHeld.Load(), CountersLeased: uint64(n),
	}
}

// Close gives back every unused hit it can (within the inner store's
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
	s.work.Wait() // the sweeper, the takes and give-backs in flight
	now := s.opts.Now()
	var wg sync.WaitGroup
	for _, c := range s.all() {
		c.mu.Lock()
		hits, rule := s.release(c, now), c.rule
		c.mu.Unlock()
		if hits > 0 {
			wg.Go(func() { s.giveBack(c, rule, hits) })
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
		if !grouped && !it.Refund && s.reserve(c, it.Hits, now) {
			// Answered from the slice as it is now: its window, and what it
			// holds (never more than remains across processes).
			held[i] = c
			results[i] = engine.Result{Admitted: true, Remaining: c.left, Reset: max(c.sliceReset.Sub(now), 0)}
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
			s.putBack(items, held, false)
			return false, err
		}
	}
	if !admitted {
		s.putBack(items, held, true)
	}
	var local uint64
	for i, c := range held {
		if c != nil && (admitted || items[i].CountDenied) {
			local += items[i].Hits
		}
	}
	s.hitsLocal.Add(local)
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

// putBack returns the reservations of held to their slices: all of them
// on an error, those that do not count when denied on a denial.
func (s *Store) putBack(items []engine.Item, held []*counter, denied bool) {
	for i, c := range held {
		if c == nil || (denied && items[i].CountDenied) {
			continue
		}
		c.mu.Lock()
		c.left += items[i].Hits
		s.hitsHeld.Add(items[i].Hits)
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
	if !now.Before(c.until) || lowered(c.rule, rule) {
		return 0, 0 // lapsed, or not to be spent under rule (follow)
	}
	return c.left, c.until.Sub(now)
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
	s.counters[k] = c
	return c
}

// tokens reports whether c's rule is a token bucket, whose slices live
// for a time rather than a window.
func tokens(c *counter) bool { return c.rule.Algorithm() == engine.TokenBucket }

// reserve takes hits from c's slice when it covers them at now. c.mu held.
func (s *Store) reserve(c *counter, hits uint64, now time.Time) bool {
	if c.left == 0 {
		return false
	}
	if !now.Before(c.until) {
		s.expire(c, now)
		return false
	}
	if c.left < hits {
		return false
	}
	c.left -= hits
	s.hitsHeld.Add(-hits)
	return true
}

// expire ends c's slice, whose time is over: a bucket's tokens are given
// back, a window's hits lapse with it. c.mu held.
func (s *Store) expire(c *counter, now time.Time) {
	if tokens(c) {
		s.giveBackLater(c, s.release(c, now))
		return
	}
	s.lost(c.left)
	s.hitsHeld.Add(-c.left)
	c.left = 0
}

// release empties c's slice for a give-back at now and returns its hits,
// or 0 when a give-back could land after the slice's window (the hits then
// stay held until it ends, and lapse). c.mu held.
func (s *Store) release(c *counter, now time.Time) uint64 {
	if c.left == 0 {
		return 0
	}
	if !s.givable(c, c.until, now) {
		return 0
	}
	hits := c.left
	c.left = 0
	s.hitsHeld.Add(-hits)
	return hits
}

// givable reports whether a give-back sent at now of hits of c's counter
// that may be spent until until surely lands before their window ends: a
// bucket's tokens always may be. c.mu held.
func (s *Store) givable(c *counter, until, now time.Time) bool {
	return tokens(c) || now.Add(2*s.opts.StoreTimeout+clockMargin).Before(until)
}

// lost counts hits that were held and not given back.
func (s *Store) lost(hits uint64) {
	if hits > 0 {
		s.slicesLost.Add(1)
		s.hitsLost.Add(hits)
	}
}

// giveBackLater gives back hits released from c in the background; when
// the store is closing, they go back to c for Close to give back. c.mu
// held.
func (s *Store) giveBackLater(c *counter, hits uint64) {
	rule := c.rule
	if hits > 0 && !s.spawn(func() { s.giveBack(c, rule, hits) }) {
		c.left += hits
		s.hitsHeld.Add(hits)
	}
}

// giveBack refunds hits of c's counter in the inner store, under rule:
// the rule, of those they were taken under, that admits the most, so that
// a bucket gets back no more tokens than were taken.
func (s *Store) giveBack(c *counter, rule *engine.Rule, hits uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), max(s.opts.StoreTimeout, 10*time.Millisecond))
	defer cancel()
	items := [1]engine.Item{{Desc: c.desc, Rule: rule, Hits: hits, Refund: true}}
	var res [1]engine.Result
	if _, err := s.inner.Apply(ctx, items[:], res[:]); err != nil {
		s.lost(hits)
		s.log.Debug("lease: giving back a slice failed", "error", err)
		return
	}
	s.hitsGivenBack.Add(hits)
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
	if c.taking || s.closed.Load() || now.Before(c.backoff) || c.left > c.lastSize/2 {
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
	if size < minSlice {
		return
	}
	rule := c.rule
	c.taking = s.spawn(func() { s.take(c, rule, size) })
}

// sliceSize is the slice to take for c at now: what lasts Hold at its
// rate, within a share of what remains, what the window's rest can use
// and the rule's capacity. c.mu held.
func (s *Store) sliceSize(c *counter, now time.Time) uint64 {
	want := c.rate * s.opts.Hold.Seconds()
	if !tokens(c) && now.Before(c.reset) {
		want = min(want, c.rate*c.reset.Sub(now).Seconds())
	}
	remaining := c.rule.Capacity()
	if now.Before(c.remainingUntil) {
		remaining = min(remaining, c.remaining)
	}
	size := min(math.Ceil(want), float64(remaining/shareDivisor), float64(engine.MaxHits))
	if size < 0 {
		return 0
	}
	return uint64(size)
}

// take asks the inner store for a slice of size hits of c's counter under
// rule and holds what it grants, unless c's rule admits less by then
// (follow): the slice is then given back.
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
	until := sent.Add(res[0].Reset - clockMargin)
	if tokens(c) {
		until = sent.Add(2*s.opts.Hold - clockMargin)
	}
	s.slicesTaken.Add(1)
	s.hitsTaken.Add(size)
	if lowered(rule, c.rule) {
		// Taken under a rule that admits more than the counter's now.
		if s.givable(c, until, now) && s.spawn(func() { s.giveBack(c, rule, size) }) {
			return
		}
		s.lost(size)
		return
	}
	if c.left > 0 && now.Before(c.until) {
		until = minTime(until, c.until)
	} else if c.left > 0 {
		s.expire(c, now)
	}
	if c.left == 0 {
		c.sliceReset = c.reset // the window of this take (a merged slice keeps its own)
	}
	c.left += size
	c.until, c.lastSize = until, size
	s.hitsHeld.Add(size)
}

// follow makes rule, the one a request on c's counter is decided under,
// c's rule: a reload, or anything else that changes a limit, applies to
// the next slice, which is taken and sized under it. When rule admits less
// than c's rule did (a lower limit or burst), the slice held is not spent
// under it: its hits are given back, under the rule they were taken under,
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
	if !lowered(old, rule) || c.left == 0 {
		return
	}
	hits := s.release(c, now)
	if hits > 0 && !s.spawn(func() { s.giveBack(c, old, hits) }) {
		s.lost(hits) // closing: lost rather than held, to be spent under rule
	}
	if c.left > 0 { // too near its window's end for a give-back
		s.lost(c.left)
		s.hitsHeld.Add(-c.left)
		c.left = 0
	}
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

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// sweeper gives back the slices of counters gone quiet, ends those whose
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
		switch {
		case c.left > 0 && !now.Before(c.until):
			s.expire(c, now)
		case c.left > 0 && now.Sub(c.lastHit) >= s.opts.Quiet:
			s.giveBackLater(c, s.release(c, now))
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
	return c.left == 0 && !c.taking && now.Sub(c.lastHit) >= max(10*s.opts.Quiet, time.Second)
}
