// Package memstore is the embedded engine.Store: counters in process memory,
// sharded by descriptor, with expired counters reclaimed and total memory
// bounded. It decides with engine.Evaluate, so its semantics are exactly
// those of the Redis store; it knows nothing about transports.
package memstore

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// MaxBytes bounds the memory the counters take, approximately (keys,
	// state, log entries and map overhead are counted). When a shard is over
	// its share, the counters closest to expiry are evicted first: an
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

// entryOverhead approximates the bytes a counter costs besides its key and
// log: the entry, the map slot and the key's string headers.
const entryOverhead = 160

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
	// entries maps the hash of (descriptor, limit ID) to the counters with
	// that hash, chained through entry.next (collisions are rare).
	entries map[uint64]*entry // guarded by mu
	bytes   int64             // guarded by mu
}

type entry struct {
	desc, id string
	next     *entry
	st       engine.State
	limit    *descriptors.Limit
	expires  int64 // µs since the epoch; the state is zero from then on
	size     int64
	removed  bool
}

// find returns the counter (desc, id) with hash h, nil if absent. Requires
// sh.mu held.
func (sh *shard) find(h uint64, desc, id string) *entry {
	for e := sh.entries[h]; e != nil; e = e.next {
		if e.id == id && e.desc == desc {
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

// Apply implements engine.Store.
func (s *Store) Apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var shardBuf [8]uint8
	var stateBuf [16]*engine.State
	var entryBuf [16]*entry
	var hashBuf [16]uint64
	order := shardBuf[:0]
	states, entries, hashes := stateBuf[:0], entryBuf[:0], hashBuf[:0]
	if len(items) > len(stateBuf) {
		states = make([]*engine.State, 0, len(items))
		entries = make([]*entry, 0, len(items))
		hashes = make([]uint64, 0, len(items))
	}
	for i := range items {
		d := maphash.String(s.seed, items[i].Desc)
		hashes = append(hashes, d^maphash.String(s.seed, items[i].Limit.ID)*0x9E3779B97F4A7C15)
		order = insertSorted(order, uint8(d%numShards))
	}
	for _, i := range order {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range order {
			s.shards[i].mu.Unlock()
		}
	}()

	now := s.now()
	t := now.UnixMicro()
	for i := range items {
		it := &items[i]
		sh := &s.shards[s.shardOf(it.Desc)]
		e := sh.find(hashes[i], it.Desc, it.Limit.ID)
		if e != nil && e.expires <= t {
			// Expired: equivalent to a fresh counter. Reuse the entry.
			e.st = engine.State{Log: e.st.Log[:0]}
		}
		if e == nil {
			e = &entry{desc: it.Desc, id: it.Limit.ID, next: sh.entries[hashes[i]]}
			e.size = entryOverhead + int64(len(it.Desc)+len(it.Limit.ID))
			sh.entries[hashes[i]] = e
			sh.bytes += e.size
		}
		e.limit = it.Limit
		states = append(states, &e.st)
		entries = append(entries, e)
	}

	admitted := engine.Evaluate(now, items, states, results)

	for i, e := range entries {
		if e.removed {
			continue // the same counter twice in this request
		}
		sh := &s.shards[s.shardOf(e.desc)]
		e.expires = engine.Expiry(e.limit, &e.st)
		size := entryOverhead + int64(len(e.desc)+len(e.id)) + 8*int64(cap(e.st.Log))
		sh.bytes += size - e.size
		e.size = size
		if e.expires <= t {
			// Nothing worth keeping (for example a denied first request).
			sh.remove(hashes[i], e)
		}
	}
	for _, i := range order {
		s.shards[i].evict(s.shardBytes)
	}
	return admitted, nil
}

func (s *Store) shardOf(desc string) uint8 {
	return uint8(maphash.String(s.seed, desc) % numShards)
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

// evict removes counters while the shard is over budget: among a few sampled
// counters, the one that expires first goes. Requires sh.mu held.
func (sh *shard) evict(budget int64) {
	for sh.bytes > budget && len(sh.entries) > 0 {
		var vh uint64
		var ve *entry
		n := 0
		for h, e := range sh.entries { // map iteration starts at a random place
			if ve == nil || e.expires < ve.expires {
				vh, ve = h, e
			}
			if n++; n == 8 {
				break
			}
		}
		sh.remove(vh, ve)
	}
}

// sweep removes expired counters, one shard per tick, until Close.
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
				if e.expires <= t {
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
		counters += len(sh.entries)
		bytes += sh.bytes
		sh.mu.Unlock()
	}
	return counters, bytes
}

// Ping reports the store as ready; memory is always there.
func (s *Store) Ping(context.Context) error { return nil }
