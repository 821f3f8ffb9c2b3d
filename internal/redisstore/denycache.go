package redisstore

import (
	"sync"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// denyCache remembers, per counter, that Redis denied a number of hits until
// an instant it computed. Until then a request asking at least as many hits
// of that counter, under the same limit, is denied without a round trip:
// exactly what Redis would answer, unless hits are given back meanwhile.
//
// Hits given back anywhere are announced by Redis on the channel
// <prefix>freed (decide.lua for refunds, release.lua for released cluster
// reservations), and the store drops the counter's entry when the notice
// arrives. Entries are only kept while that subscription is live, and a
// denial is not kept when any notice arrived while its request was in
// flight (its answer may predate the refund). Safe for concurrent use.
type denyCache struct {
	mu    sync.Mutex
	m     map[string]denial // by counter base key; guarded by mu
	max   int
	live  bool   // the notices are being received; guarded by mu
	epoch uint64 // notices and subscription changes seen; guarded by mu
}

type denial struct {
	until     time.Time // on the store's local clock, never after Redis's instant
	resetAt   time.Time // likewise, the limit's reset
	hits      uint64
	remaining uint64
	// the limit it was computed under
	rpu, burst uint32
	window     time.Duration
}

func newDenyCache(max int) *denyCache {
	return &denyCache{m: make(map[string]denial), max: max}
}

// cacheable reports whether an item's denial may stand for later requests:
// a shadow item never denies, a quota item denies only with its group, and
// a refund always admits.
func cacheable(it *engine.Item) bool {
	return !it.Shadow && !it.Refund && it.Group == 0 && it.Hits > 0
}

// deny answers the request from the cache when one of its items is known
// to be denied at now: the known denials get their results, every other
// item is Skipped. It reports whether it answered, and the epoch to pass
// to remember when it did not.
func (c *denyCache) deny(items []engine.Item, bases []string, results []engine.Result, now time.Time) (bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) == 0 {
		return false, c.epoch
	}
	denied := false
	for i := range items {
		it := &items[i]
		if it.Refund {
			// Hits given back: the counter may admit again before the
			// cached instant.
			delete(c.m, bases[i])
			continue
		}
		if !cacheable(it) {
			continue
		}
		d, ok := c.m[bases[i]]
		if !ok || !d.matches(it) || !now.Before(d.until) || it.Hits < d.hits {
			continue
		}
		if !denied {
			denied = true
			for j := range results[:len(items)] {
				results[j] = engine.Result{Skipped: true}
			}
		}
		results[i] = engine.Result{Cached: true, Remaining: d.remaining, RetryAfter: d.until.Sub(now), Reset: max(0, d.resetAt.Sub(now))}
	}
	return denied, c.epoch
}

func (d *denial) matches(it *engine.Item) bool {
	l := it.Limit
	return d.rpu == l.RequestsPerUnit && d.burst == l.Burst && d.window == l.Window
}

// remember stores the denials of an answered request; sent is when the
// request left, so that sent + RetryAfter is never after Redis's instant,
// and epoch what deny returned then. Nothing is stored when the notices are
// not live or one arrived since (the denial may be older than a refund).
func (c *denyCache) remember(items []engine.Item, bases []string, results []engine.Result, sent time.Time, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || c.epoch != epoch {
		return
	}
	for i := range items {
		it, r := &items[i], &results[i]
		if r.Admitted || !cacheable(it) || r.RetryAfter <= 0 {
			continue
		}
		if len(c.m) >= c.max {
			c.evict(sent)
		}
		l := it.Limit
		c.m[bases[i]] = denial{
			until: sent.Add(r.RetryAfter), resetAt: sent.Add(r.Reset), hits: it.Hits, remaining: r.Remaining,
			rpu: l.RequestsPerUnit, burst: l.Burst, window: l.Window,
		}
	}
}

// evict makes room: among a few entries (map iteration starts at a random
// place), the expired ones go, or the first one when none is. Dropping an
// entry only costs a round trip later. Requires c.mu held.
func (c *denyCache) evict(now time.Time) {
	seen, dropped := 0, 0
	var first string
	for k, d := range c.m {
		if seen == 0 {
			first = k
		}
		if !now.Before(d.until) {
			delete(c.m, k)
			dropped++
		}
		if seen++; seen == 32 {
			break
		}
	}
	if dropped == 0 {
		delete(c.m, first)
	}
}

// freed drops the entry of a counter whose hits were given back.
func (c *denyCache) freed(base string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	delete(c.m, base)
}

// setLive records whether the notices are received. Either way every entry
// goes: notices may have been missed around the change.
func (c *denyCache) setLive(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.live = live
	clear(c.m)
}

func (c *denyCache) isLive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}
