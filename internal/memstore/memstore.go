// Package memstore is the embedded engine.Store: counters in process memory,
// sharded by descriptor, with expired counters reclaimed and total memory
// bounded. It decides with engine.Evaluate, so its semantics are exactly
// those of the Redis store; it knows nothing about transports.
package memstore

import (
	"context"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// MaxBytes bounds the memory the counters take, approximately (keys,
	// state, log entries and map overhead are counted). When a shard is over
	// its share, the descriptors whose counters expire first are evicted: an
	// evicted counter starts again from zero. 0 means DefaultMaxBytes.
	MaxBytes int64
	// Now is the store's clock; nil means time.Now. Tests pass fixed instants.
	Now func() time.Time
	// SweepEvery is how often one shard is swept for expired counters; 0 means
	// 50ms (every shard once every 3.2s).
	SweepEvery time.Duration
}

// DefaultMaxBytes is the memory bound when Options.MaxBytes is 0.
const DefaultMaxBytes = 256 << 20

// MinMaxBytes is the smallest useful memory bound.
const MinMaxBytes = 1 << 20

const numShards = 64

// Approximate costs, for the memory bound: an entry with its map slot and
// string header, and one counter with its state.
const (
	entryOverhead   = 112
	counterOverhead = 112
)

// Store is the in-memory engine.Store. It is safe for concurrent use. Close
// stops its sweeper; the zero value is not usable, call New.
type Store struct {
	shards     [numShards]shard
	seed       maphash.Seed
	now        func() time.Time
	shardBytes int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var _ engine.Store = (*Store)(nil)

type shard struct {
	mu sync.Mutex
	// entries maps the hash of a descriptor identity (engine.Item.Desc) to
	// the entries with that hash, chained through entry.next (collisions are
	// rare).
	entries  map[uint64]*entry // guarded by mu
	bytes    int64             // guarded by mu
	counters int               // guarded by mu
}

// entry holds the counters of one descriptor: all its windows, found with
// one map lookup.
type entry struct {
	desc     string
	next     *entry
	counters []counter
	size     int64
	removed  bool
	resize   bool // size must be computed again
}

type counter struct {
	id      string // Rule.ID
	rule    *engine.Rule
	st      engine.State
	expires int64 // µs since the epoch; the state is zero from then on
	touched bool  // by the Apply in progress
}

func (e *entry) computeSize() int64 {
	n := int64(entryOverhead + len(e.desc))
	for i := range e.counters {
		c := &e.counters[i]
		n += counterOverhead + int64(len(c.id)) + 16*int64(cap(c.st.Log)) + c.st.Holds.Bytes()
	}
	return n
}

// expires returns when the last of the entry's counters expires.
func (e *entry) expires() int64 {
	var last int64
	for i := range e.counters {
		last = max(last, e.counters[i].expires)
	}
	return last
}

// find returns the entry of desc with hash h, nil if absent. Requires sh.mu
// held.
func (sh *shard) find(h uint64, desc string) *entry {
	for e := sh.entries[h]; e != nil; e = e.next {
		if e.desc == desc {
			return e
		}
	}
	return nil
}

// remove unlinks e, filed under hash h. Requires sh.mu held.
func (sh *shard) remove(h uint64, e *entry) {
	if e.removed {
		return
	}
	e.removed = true
	sh.bytes -= e.size
	sh.counters -= len(e.counters)
	head := sh.entries[h]
	if head == e {
		if e.next == nil {
			delete(sh.entries, h)
		} else {
			sh.entries[h] = e.next
		}
		return
	}
	for p := head; p != nil; p = p.next {
		if p.next == e {
			p.next = e.next
			return
		}
	}
}

// New returns an empty store and starts its sweeper.
func New(opts Options) *Store {
	s := &Store{
		seed:       maphash.MakeSeed(),
		now:        opts.Now,
		shardBytes: opts.MaxBytes / numShards,
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	if opts.MaxBytes <= 0 {
		s.shardBytes = DefaultMaxBytes / numShards
	}
	for i := range s.shards {
		s.shards[i].entries = make(map[uint64]*entry)
	}
	every := opts.SweepEvery
	if every <= 0 {
		every = 50 * time.Millisecond
	}
	go s.sweep(every)
	return s
}

// Close stops the sweeper. It is idempotent; the store still answers after
// it, without reclaiming expired counters in the background.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
	})
	return nil
}

// Apply implements engine.Store. Its phases: find the shards of the items'
// descriptors and lock them in order; make sure every counter exists; hand
// their states to engine.Evaluate; then finish: record expiries, drop what
// has expired, account sizes, and evict while a shard is over budget.
func (s *Store) Apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var shardBuf [8]uint8
	var stateBuf [16]*engine.State
	var entryBuf [16]*entry
	var hashBuf [16]uint64
	var indexBuf [16]int
	n := len(items)
	c := applyCall{items: items}
	if n <= len(stateBuf) {
		c.states, c.entries, c.hashes, c.indexes = stateBuf[:n], entryBuf[:n], hashBuf[:n], indexBuf[:n]
	} else {
		c.states, c.entries, c.hashes, c.indexes = make([]*engine.State, n), make([]*entry, n), make([]uint64, n), make([]int, n)
	}
	c.order = c.hash(s.seed, shardBuf[:0])
	now := s.now()
	t := now.UnixMicro()
	for _, i := range c.order {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range c.order {
			s.shards[i].mu.Unlock()
		}
	}()
	c.locate(s)
	c.load(t)
	admitted := engine.Evaluate(now, items, c.states, results)
	c.finish(s, t)
	for _, i := range c.order {
		s.shards[i].evict(s.shardBytes, c.entries)
	}
	return admitted, nil
}

// Peek implements engine.Store: the request judged as Apply would, on
// copies of the counters' states (engine.Peek); nothing is created or
// changed.
func (s *Store) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	n := len(items)
	c := applyCall{items: items, hashes: make([]uint64, n), states: make([]*engine.State, n)}
	c.order = c.hash(s.seed, nil)
	now := s.now()
	t := now.UnixMicro()
	for _, i := range c.order {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range c.order {
			s.shards[i].mu.Unlock()
		}
	}()
	for i := range items {
		it := &items[i]
		for j := range i {
			if items[j].Desc == it.Desc && items[j].Rule.ID == it.Rule.ID {
				c.states[i] = c.states[j] // one counter, as Apply finds it
				break
			}
		}
		if c.states[i] != nil {
			continue
		}
		st := new(engine.State)
		if ent := c.shard(s, i).find(c.hashes[i], it.Desc); ent != nil {
			if j := counterIndex(ent, it.Rule.ID); j >= 0 && ent.counters[j].expires > t {
				*st = ent.counters[j].st
			}
		}
		c.states[i] = st
	}
	return engine.Peek(now, items, c.states, results), nil
}

// applyCall is the working set of one Apply: per item, its descriptor's
// hash, entry, counter index and state; and the shards to lock, in order.
type applyCall struct {
	items   []engine.Item
	order   []uint8 // shard indexes, sorted: the locking order
	hashes  []uint64
	entries []*entry
	indexes []int // counter index in the item's entry
	states  []*engine.State
}

func (c *applyCall) shard(s *Store, i int) *shard { return &s.shards[c.hashes[i]%numShards] }

// hash finds each item's descriptor hash, and returns the shards to lock
// appended to order. (Methods fill the call's slices by index, never by
// append, so that Apply's buffers stay on its stack.)
func (c *applyCall) hash(seed maphash.Seed, order []uint8) []uint8 {
	items := c.items
	for i := range items {
		// Windows of one descriptor come one after the other: hash once.
		if i > 0 && items[i].Desc == items[i-1].Desc {
			c.hashes[i] = c.hashes[i-1]
			continue
		}
		h := maphash.String(seed, items[i].Desc)
		c.hashes[i] = h
		order = insertSorted(order, uint8(h%numShards))
	}
	return order
}

// locate makes sure every item's entry and counter exist (appending may
// move a counter slice, so states are taken afterwards, by load). Requires
// the shards locked.
func (c *applyCall) locate(s *Store) {
	items := c.items
	for i := range items {
		it := &items[i]
		sh := c.shard(s, i)
		var ent *entry
		if i > 0 && it.Desc == items[i-1].Desc {
			ent = c.entries[i-1]
		} else if ent = sh.find(c.hashes[i], it.Desc); ent == nil {
			// Keys may alias the caller's buffers; keep copies.
			ent = &entry{desc: strings.Clone(it.Desc), next: sh.entries[c.hashes[i]]}
			sh.entries[c.hashes[i]] = ent
		}
		c.entries[i] = ent
		j := counterIndex(ent, it.Rule.ID)
		if j < 0 {
			j = len(ent.counters)
			ent.counters = append(ent.counters, counter{id: it.Rule.ID, rule: it.Rule})
			sh.counters++
			ent.resize = true
		}
		if it.Rule.StateSizeVaries() || it.Rule.Reserve != nil {
			ent.resize = true // a log's capacity, or a reservation table, may change
		}
		c.indexes[i] = j
	}
}

// load takes the items' states; an expired one starts afresh. Requires the
// shards locked.
func (c *applyCall) load(t int64) {
	for i := range c.items {
		ctr := &c.entries[i].counters[c.indexes[i]]
		if ctr.expires <= t {
			ctr.st = engine.State{Log: ctr.st.Log[:0]}
		}
		ctr.rule = c.items[i].Rule
		c.states[i] = &ctr.st
	}
}

// finish records the expiry of each counter the request touched, drops
// those that are equivalent to no state (and their entry when none is
// left), and accounts the entries' sizes. Counters of the same entries that
// the request did not touch stay as they are until the sweeper: forgetting
// a counter is only unseen while time goes forward, and Redis too forgets
// only what a request touches (or what its TTL ends). Requires the shards
// locked.
func (c *applyCall) finish(s *Store, t int64) {
	for i, ent := range c.entries {
		ctr := &ent.counters[c.indexes[i]]
		ctr.expires = ctr.rule.Prune(&ctr.st, t)
		ctr.touched = true
	}
	for i, ent := range c.entries {
		if ent.removed || (i > 0 && c.entries[i-1] == ent) {
			continue // done with the previous item (a later visit finds nothing to do)
		}
		sh := c.shard(s, i)
		live := ent.counters[:0]
		for _, ctr := range ent.counters {
			if ctr.touched && ctr.expires <= t {
				continue
			}
			ctr.touched = false
			live = append(live, ctr)
		}
		if dropped := len(ent.counters) - len(live); dropped > 0 {
			sh.counters -= dropped
			clear(ent.counters[len(live):])
			ent.counters = live
			ent.resize = true
		}
		if len(ent.counters) == 0 {
			// Nothing worth keeping (for example a denied first request).
			sh.remove(c.hashes[i], ent)
			continue
		}
		if ent.resize {
			ent.resize = false
			size := ent.computeSize()
			sh.bytes += size - ent.size
			ent.size = size
		}
	}
}

// counterIndex returns the index of the counter with rule ID id, -1 if
// absent. IDs come from the config, so equal IDs are usually the same
// string and compare by pointer.
func counterIndex(e *entry, id string) int {
	for j := range e.counters {
		if e.counters[j].id == id {
			return j
		}
	}
	return -1
}

// insertSorted adds v to the sorted set xs.
func insertSorted(xs []uint8, v uint8) []uint8 {
	i := 0
	for i < len(xs) && xs[i] < v {
		i++
	}
	if i < len(xs) && xs[i] == v {
		return xs
	}
	xs = append(xs, 0)
	copy(xs[i+1:], xs[i:])
	xs[i] = v
	return xs
}

// evict removes descriptors while the shard is over budget: among a few
// sampled entries, the one whose counters all expire first goes, but never
// one of keep (the entries of the request being decided: with equal
// expiries, as fixed windows have, it could otherwise drop what it just
// counted). Requires sh.mu held.
func (sh *shard) evict(budget int64, keep []*entry) {
	for sh.bytes > budget && len(sh.entries) > 0 {
		var vh uint64
		var ve *entry
		var vexp int64
		n := 0
		for h, e := range sh.entries { // map iteration starts at a random place
			if slices.Contains(keep, e) {
				continue
			}
			if exp := e.expires(); ve == nil || exp < vexp {
				vh, ve, vexp = h, e, exp
			}
			if n++; n == 8 {
				break
			}
		}
		if ve == nil {
			return // only this request's entries: over by at most them
		}
		sh.remove(vh, ve)
	}
}

// sweep drops expired counters, one shard per tick, until Close.
func (s *Store) sweep(every time.Duration) {
	defer close(s.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	next := 0
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		sh := &s.shards[next]
		next = (next + 1) % numShards
		t := s.now().UnixMicro()
		sh.mu.Lock()
		for h, head := range sh.entries {
			for e := head; e != nil; {
				nx := e.next
				if e.expires() <= t {
					sh.remove(h, e)
				}
				e = nx
			}
		}
		sh.mu.Unlock()
	}
}

// Stats returns the number of counters held and the bytes they are counted
// as taking.
func (s *Store) Stats() (counters int, bytes int64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		counters += sh.counters
		bytes += sh.bytes
		sh.mu.Unlock()
	}
	return counters, bytes
}

// Ping implements engine.Store: memory is always there.
func (s *Store) Ping(context.Context) error { return nil }

// Reset implements engine.Store: each item's counter expires now.
func (s *Store) Reset(ctx context.Context, items []engine.Item) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c := applyCall{items: items, hashes: make([]uint64, len(items))}
	c.order = c.hash(s.seed, nil)
	t := s.now().UnixMicro()
	for _, i := range c.order {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range c.order {
			s.shards[i].mu.Unlock()
		}
	}()
	cleared := 0
	for i := range items {
		ent := c.shard(s, i).find(c.hashes[i], items[i].Desc)
		if ent == nil {
			continue
		}
		if j := counterIndex(ent, items[i].Rule.ID); j >= 0 && ent.counters[j].expires > t {
			ent.counters[j].st, ent.counters[j].expires = engine.State{}, 0
			ent.resize = true
			cleared++
		}
	}
	return cleared, nil
}
