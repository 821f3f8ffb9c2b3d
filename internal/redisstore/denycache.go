package redisstore

import (
	"slices"
	"sync"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// denyCache remembers, per counter, that Redis denied a number of hits until
// an instant it computed. Until then a request asking as many hits of that
// counter (or more, for a fixed window), under the same limit, is denied
// without a round trip, with exactly the status Redis would answer unless
// hits are given back meanwhile. Only denials that leave nothing remaining
// are kept, of one hit (or of a fixed window): until the instant, nobody
// can consume from such a counter under that limit (an override sharing it
// drops the entry when it consumes here), so its remaining (0), reset and retry
// instant cannot change, whichever process asks.
//
// Hits given back anywhere are announced by Redis on the channel
// <prefix>freed (the decide function for refunds, release.lua for released
// cluster reservations), and the store drops the counter's entry when the notice
// arrives. Entries are only kept while that subscription is live, and a
// denial is not kept when a notice for its counter arrived while its
// request was in flight (its answer may predate the refund). Safe for
// concurrent use.
type denyCache struct {
	mu  sync.Mutex
	m   map[string]denial // by counter base key; guarded by mu
	max int
	// Guarded by mu: whether the notices are being received; how many
	// notices and subscription changes were seen (epoch), the epoch of the
	// last subscription change, and the counters of the latest notices
	// (recent[e%len] for notice e).
	live   bool
	epoch  uint64
	liveAt uint64
	recent [64]string
	// stats, guarded by mu
	stats DenyCacheStats
}

// DenyCacheStats are the denial cache's counters since the store started
// (each a running total, but Entries).
type DenyCacheStats struct {
	// Lookups are the requests that asked the cache; Hits those it
	// answered (denied with no round trip); the rest went to Redis.
	Lookups, Hits uint64
	// Entries are the denials held now.
	Entries uint64
	// Evicted are entries dropped to make room while they still held;
	// Expired, entries dropped to make room once past their instant.
	Evicted, Expired uint64
	// Overwritten are entries replaced by a newer denial of their counter.
	Overwritten uint64
}

// DenyCacheStats returns the denial cache's counters, and false when the
// store has no denial cache (Options.DenyCache off). With a per-second
// Redis they are those of both backends' caches, as the reference's one
// local cache serves both its Redis: a request asks once, whichever holds
// its counters (fromCache). Safe for concurrent use.
func (s *Store) DenyCacheStats() (DenyCacheStats, bool) {
	if !s.opts.DenyCache {
		return DenyCacheStats{}, false
	}
	var st DenyCacheStats
	for _, b := range s.backends {
		c := b.cache.snapshot()
		st.Lookups += c.Lookups
		st.Hits += c.Hits
		st.Entries += c.Entries
		st.Evicted += c.Evicted
		st.Expired += c.Expired
		st.Overwritten += c.Overwritten
	}
	return st, true
}

// snapshot returns c's counters and its entries now.
func (c *denyCache) snapshot() DenyCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.Entries = uint64(len(c.m))
	return st
}

type denial struct {
	at        time.Time // when the request left, on the store's local clock
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
// a shadow item never denies, a quota item denies only with its group, a
// refund always admits, a count-denied item takes its hits even when
// denied (Redis must count them), a penalized item's denials are strikes
// (Redis must record them), and a limit that reserves keeps its
// reservations in Redis: a settle must reach them whatever the counter
// says, a hold may end by itself at any instant, and its answers report
// its holds.
func cacheable(it *engine.Item) bool {
	return !it.Shadow && !it.Refund && !it.CountDenied && it.Group == 0 && it.Hits > 0 && !it.Rule.Penalized() && it.Rule.Reserve == nil
}

// deny answers a request's items (all of them, or its share on this
// cache's Redis) from the cache when every one of them is a denial it
// knows at now: then each status is exactly what Redis would answer. A
// request with any other item (one admitted, not cacheable, or unknown)
// goes to Redis, which judges them all, so that every status is whole. It
// reports whether it answered, and the epoch to pass to remember when it
// did not. The request is counted apart (counted), once for all its
// shares.
func (c *denyCache) deny(items []engine.Item, bases []string, results []engine.Result, now time.Time) (bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answer(items, bases, results, now), c.epoch
}

// counted counts a request that asked the cache, answered from it or not.
func (c *denyCache) counted(answered bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Lookups++
	if answered {
		c.stats.Hits++
	}
}

// answer is deny's judgement. Requires c.mu held.
func (c *denyCache) answer(items []engine.Item, bases []string, results []engine.Result, now time.Time) bool {
	now = toMicro(now) // the stores' resolution, as Redis and the engine see it
	answered := len(c.m) > 0
	for i := range items {
		it := &items[i]
		if it.Refund {
			// Hits given back: the counter may admit again before the
			// cached instant.
			delete(c.m, bases[i])
			answered = false
			continue
		}
		if !answered {
			continue
		}
		d, ok := c.m[bases[i]]
		answered = cacheable(it) && ok && d.matches(it) && d.holds(now) &&
			(it.Hits == d.hits || it.Hits > d.hits && it.Rule.DenialCoversMoreHits())
	}
	if !answered {
		return false
	}
	for i := range items {
		d := c.m[bases[i]]
		results[i] = engine.Result{Cached: true, Remaining: d.remaining, RetryAfter: d.until.Sub(now), Reset: d.resetAt.Sub(now)}
		if items[i].Hits > items[i].Rule.Capacity() {
			// More hits than the limit (a rule whose denial covers more hits
			// than the denial's): no wait admits them.
			results[i].RetryAfter, results[i].Never = 0, true
		}
	}
	return true
}

// holds reports whether the cached status is still exact at now: before
// the retry instant and before the reset (a sliding window's reset moves to
// the next window's end; a log's to its next entry), and not before the
// denial was learnt (a clock that steps back may find a counter with no
// state, a limit of 0, in an earlier window).
func (d *denial) holds(now time.Time) bool {
	return !now.Before(d.at) && now.Before(d.until) && now.Before(d.resetAt)
}

func (d *denial) matches(it *engine.Item) bool {
	r := it.Rule
	return d.rpu == r.Limit && d.burst == r.Burst && d.window == r.Window
}

// remember stores the denials of a request that Redis answered; sent is
// when the request left, so that sent + RetryAfter is never after Redis's
// instant, and epoch what deny returned then. Nothing is stored when the
// notices are not live, or were not followed all along since; nor is the
// denial of a counter announced since (its answer may predate the
// refund). An admitted request consumed: its counters' entries go (another
// limit on the same counter, an override, may consume past a cached 0).
func (c *denyCache) remember(items []engine.Item, bases []string, results []engine.Result, admitted bool, sent time.Time, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if admitted {
		if len(c.m) > 0 {
			for i, b := range bases {
				if items[i].Hits > 0 {
					delete(c.m, b)
				}
			}
		}
		return
	}
	// A denied request still charged its count-denied items: what was
	// cached of those counters now comes too early.
	for i := range items {
		if items[i].CountDenied && items[i].Hits > 0 {
			delete(c.m, bases[i])
		}
	}
	if !c.live || c.liveAt > epoch || c.epoch-epoch > uint64(len(c.recent)) {
		return
	}
	at := toMicro(sent)
	for i := range items {
		it, r := &items[i], &results[i]
		// A denial with no reset or retry ahead would never hold; one that
		// never passes (Never) has no retry either.
		if r.Admitted || !cacheable(it) || r.RetryAfter <= 0 || r.Reset <= 0 || r.Remaining != 0 ||
			it.Hits != 1 && !it.Rule.DenialCoversMoreHits() {
			continue
		}
		if c.noticedSince(epoch, bases[i]) {
			continue // its answer may predate hits given back
		}
		if slices.Contains(bases[:i], bases[i]) || countedDenied(items, bases, bases[i]) {
			// An earlier item of the request consumed from this counter
			// tentatively when this one was judged: its retry instant
			// counts hits that were not taken.
			continue
		}
		if _, ok := c.m[bases[i]]; ok {
			c.stats.Overwritten++
		} else if len(c.m) >= c.max {
			c.evict(sent)
		}
		rule := it.Rule
		c.m[bases[i]] = denial{
			at: at, until: at.Add(r.RetryAfter), resetAt: at.Add(r.Reset), hits: it.Hits, remaining: r.Remaining,
			rpu: rule.Limit, burst: rule.Burst, window: rule.Window,
		}
	}
}

// countedDenied reports whether a count-denied item of the request charged
// the counter base (its hits counted after the judging, so a denial of it
// computed in the judging may predate them).
func countedDenied(items []engine.Item, bases []string, base string) bool {
	for i := range items {
		if items[i].CountDenied && items[i].Hits > 0 && bases[i] == base {
			return true
		}
	}
	return false
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
	c.stats.Expired += uint64(dropped)
	if dropped == 0 {
		delete(c.m, first)
		c.stats.Evicted++
	}
}

// freed drops the entry of a counter whose hits were given back.
func (c *denyCache) freed(base string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recent[c.epoch%uint64(len(c.recent))] = base
	c.epoch++
	delete(c.m, base)
}

// noticedSince reports whether a notice for base arrived since epoch (the
// caller has checked that recent still holds them all). Requires c.mu.
func (c *denyCache) noticedSince(epoch uint64, base string) bool {
	for e := epoch; e < c.epoch; e++ {
		if c.recent[e%uint64(len(c.recent))] == base {
			return true
		}
	}
	return false
}

// setLive records whether the notices are received. Either way every entry
// goes: notices may have been missed around the change.
func (c *denyCache) setLive(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recent[c.epoch%uint64(len(c.recent))] = ""
	c.epoch++
	c.liveAt = c.epoch
	c.live = live
	clear(c.m)
}

func (c *denyCache) isLive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// toMicro drops what t has below the microsecond, the resolution of the
// instants the scripts and the engine compute with. It keeps t's monotonic
// reading, so that a step of the wall clock does not stretch a denial.
func toMicro(t time.Time) time.Time { return t.Add(-time.Duration(t.Nanosecond() % 1000)) }
