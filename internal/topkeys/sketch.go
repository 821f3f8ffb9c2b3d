package topkeys

import (
	"crypto/sha256"
	"encoding/hex"
	"unicode/utf8"

	"github.com/rlsproject/rls/internal/config"
)

// The sketch of one limit over one window. Two rankings share one table of
// entries, each entry in one or both:
//
//   - denied: Space-Saving (Metwally et al.) over the limit's denials.
//     With K counters and D denials in the window, every key denied more
//     than D/K times is in it, and an entry's count is at most its error
//     (the least count when it came in, ≤ D/K) above the key's true
//     denials: true ∈ [count−err, count].
//   - full: the K fullest keys at their last decision, among those at
//     least MinFullness full. A key that is not in it was, at its last
//     decision, below MinFullness or no fuller than the least full entry
//     then.
//
// Admitted and denied are also counted per entry from the moment it came
// in (a lower bound of the key's window). Memory is at most 2K entries of
// bounded size (entryBytes), whatever the number of distinct keys.

// MinFullness is the least fullness that puts a key in the full ranking:
// keys less than half spent are not watched (as in rls_limit_keys_fullness),
// so that the ordinary traffic of many keys does not churn the ranking.
const MinFullness = 0.5

// Bounds on what an entry keeps of its descriptor: values and keys longer
// than maxShown bytes are shortened (shortened), so that an entry's size
// is bounded whatever the request sends.
const maxShown = 128

// entryOverhead is what an entry costs beside its strings: the struct, its
// map slot, its places in the two heaps, and a slice header per entry of
// its descriptor (counted with the strings).
const entryOverhead = 192

// entryBytes bounds the bytes of one entry: its identity (at most
// maxIdentity) and its descriptor's shown keys and values.
func entryBytes() int64 {
	return entryOverhead + maxIdentity + int64(config.MaxDepth)*int64(2*(maxShown+shortSuffix)+32)
}

// maxIdentity bounds a counter identity (engine.AppendDescriptorKey: each
// part escaped, at most 64 bytes, else a 23-byte hash): the domain and
// MaxDepth entries of two parts, each part with its separator.
const maxIdentity = (1 + 2*config.MaxDepth) * 65

// shortSuffix is what shortening adds: "…" and 12 hex digits of the
// whole's SHA-256.
const shortSuffix = len("…") + 12

// entry is one key of a sketch.
type entry struct {
	id      string         // the counter's identity (engine.Item.Desc)
	entries []config.Entry // the descriptor, keys and values shortened
	short   bool           // some key or value was shortened
	// count and err are the key's Space-Saving count and error while it
	// is in the denied heap.
	count, err uint64
	// denied counts the denials since the entry was made; admitted the
	// admissions since, plus the hits its counter held then.
	denied, admitted uint64
	fullness         float64 // at the key's last decision
	di, fi           int     // index in the denied and full heaps; -1 when not in it
	bytes            int64
}

// sketch is the sketch of one limit in one window. Not safe for concurrent
// use: limitSketch holds it under its lock.
type sketch struct {
	k      int
	byID   map[string]*entry
	denied heap // by count
	full   heap // by fullness
	// denials and decisions are those of the window.
	denials, decisions uint64
	bytes              int64 // held by the entries
}

func newSketch(k int) *sketch {
	return &sketch{k: k, byID: make(map[string]*entry),
		denied: heap{less: func(a, b *entry) bool { return a.count < b.count }, at: func(e *entry) *int { return &e.di }},
		full:   heap{less: func(a, b *entry) bool { return a.fullness < b.fullness }, at: func(e *entry) *int { return &e.fi }},
	}
}

// reset empties s for a new window, keeping its allocations.
func (s *sketch) reset() {
	clear(s.byID)
	s.denied.clear()
	s.full.clear()
	s.denials, s.decisions, s.bytes = 0, 0, 0
}

// verdict is one limit's decision on a key: admitted or not, how full it
// left the key (0 to 1), and the hits its counter held then (used).
type verdict struct {
	admitted bool
	fullness float64
	used     uint64
}

// observe counts one decision on the key id (whose descriptor is entries).
// entries are copied only when the key enters the sketch.
func (s *sketch) observe(id string, entries []config.Entry, v verdict) {
	admitted, fullness := v.admitted, v.fullness
	s.decisions++
	e := s.byID[id]
	if e != nil {
		e.fullness = fullness
		if admitted {
			e.admitted++
		} else {
			e.denied++
		}
	}
	if !admitted {
		s.denials++
		e = s.countDenial(e, id, entries, v)
	}
	switch {
	case e != nil && e.fi >= 0:
		s.full.fix(e.fi)
	case fullness >= MinFullness:
		s.placeFull(e, id, entries, v)
	}
}

// countDenial counts a denial of id (e its entry, nil when it has none) in
// the denied heap, and returns its entry (nil when it has none).
func (s *sketch) countDenial(e *entry, id string, entries []config.Entry, v verdict) *entry {
	switch {
	case e != nil && e.di >= 0:
		e.count++
		s.denied.fix(e.di)
		return e
	case s.denied.len() < s.k:
		if e == nil {
			e = s.add(id, entries, v)
		}
		e.count, e.err = 1, 0
		s.denied.push(e)
		return e
	}
	// Full: the key takes the place of the least counted, with its count
	// as error.
	least := s.denied.items[0]
	if e == nil {
		e = s.add(id, entries, v)
	}
	e.count, e.err = least.count+1, least.count
	s.denied.replaceLeast(e)
	s.dropIfOut(least)
	return e
}

// placeFull puts id (e its entry, nil when it has none), which is not in
// the full heap, there at fullness when the heap has room or it is fuller
// than the least full.
func (s *sketch) placeFull(e *entry, id string, entries []config.Entry, v verdict) {
	switch {
	case s.full.len() < s.k:
		if e == nil {
			e = s.add(id, entries, v)
		}
		s.full.push(e)
	case v.fullness > s.full.items[0].fullness:
		least := s.full.items[0]
		if e == nil {
			e = s.add(id, entries, v)
		}
		s.full.replaceLeast(e)
		s.dropIfOut(least)
	}
}

// add makes the entry of a key seen for the first time (or again after it
// left), counting the decision that brings it: its admissions start from
// the hits its counter holds (this decision's among them when admitted).
func (s *sketch) add(id string, entries []config.Entry, v verdict) *entry {
	e := &entry{id: clip(id), di: -1, fi: -1, fullness: v.fullness, admitted: v.used}
	if !v.admitted {
		e.denied = 1
	}
	e.entries = make([]config.Entry, len(entries))
	e.bytes = entryOverhead + int64(len(e.id))
	for i, en := range entries {
		k, ks := shorten(en.Key)
		v, vs := shorten(en.Value)
		e.entries[i] = config.Entry{Key: k, Value: v}
		e.short = e.short || ks || vs
		e.bytes += int64(len(k)+len(v)) + 32
	}
	s.byID[e.id] = e
	s.bytes += e.bytes
	return e
}

// dropIfOut forgets e when it is in neither heap.
func (s *sketch) dropIfOut(e *entry) {
	if e.di < 0 && e.fi < 0 {
		delete(s.byID, e.id)
		s.bytes -= e.bytes
	}
}

// remove forgets the key id (its counter was reset).
func (s *sketch) remove(id string) {
	e := s.byID[id]
	if e == nil {
		return
	}
	if e.di >= 0 {
		s.denied.remove(e.di)
	}
	if e.fi >= 0 {
		s.full.remove(e.fi)
	}
	s.dropIfOut(e)
}

// clip returns id as the sketch keeps it: a copy (the decision's is the
// request's), at most maxIdentity bytes.
func clip(id string) string {
	if len(id) > maxIdentity {
		id = id[:maxIdentity]
	}
	return string(append([]byte(nil), id...))
}

// shorten returns a copy of s, shortened to maxShown bytes (at a rune
// boundary) followed by "…" and a hash of the whole when it is longer, and
// whether it was.
func shorten(s string) (string, bool) {
	if len(s) <= maxShown {
		return string(append([]byte(nil), s...)), false
	}
	cut := maxShown
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	sum := sha256.Sum256([]byte(s))
	return s[:cut] + "…" + hex.EncodeToString(sum[:6]), true
}

// heap is a binary min-heap of entries by less, in which each entry knows
// its place (at: its di or fi; -1 when not in it), so that a key's count
// or fullness is fixed in place. The sketch has two, on the same entries.
type heap struct {
	items []*entry
	less  func(a, b *entry) bool
	at    func(e *entry) *int
}

func (h *heap) len() int { return len(h.items) }

// clear empties h, keeping its allocation.
func (h *heap) clear() {
	clear(h.items)
	h.items = h.items[:0]
}

// push adds e, which is not in h.
func (h *heap) push(e *entry) {
	*h.at(e) = len(h.items)
	h.items = append(h.items, e)
	h.up(len(h.items) - 1)
}

// replaceLeast puts e, which is not in h, in the place of the least entry,
// which leaves h.
func (h *heap) replaceLeast(e *entry) {
	*h.at(h.items[0]) = -1
	*h.at(e) = 0
	h.items[0] = e
	h.down(0)
}

// remove takes the entry at i out of h.
func (h *heap) remove(i int) {
	last := len(h.items) - 1
	e := h.items[i]
	h.swap(i, last)
	h.items[last] = nil
	h.items = h.items[:last]
	*h.at(e) = -1
	if i < last {
		h.fix(i)
	}
}

// fix restores h after the entry at i changed, either way.
func (h *heap) fix(i int) {
	if !h.up(i) {
		h.down(i)
	}
}

func (h *heap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	*h.at(h.items[i]), *h.at(h.items[j]) = i, j
}

// up moves the entry at i up while it is less than its parent, and
// reports whether it moved.
func (h *heap) up(i int) bool {
	moved := false
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			break
		}
		h.swap(i, p)
		i, moved = p, true
	}
	return moved
}

// down moves the entry at i down while a child is less.
func (h *heap) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(h.items[r], h.items[l]) {
			m = r
		}
		if !h.less(h.items[m], h.items[i]) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

// leastDenied returns the least count of the denied heap when it is full
// (what a key absent from it may have been denied at most), else 0.
func (s *sketch) leastDenied() uint64 {
	if s.denied.len() < s.k || s.denied.len() == 0 {
		return 0
	}
	return s.denied.items[0].count
}

// leastFull returns the least fullness of the full heap when it is full,
// else 0.
func (s *sketch) leastFull() float64 {
	if s.full.len() < s.k || s.full.len() == 0 {
		return 0
	}
	return s.full.items[0].fullness
}
