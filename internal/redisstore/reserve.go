package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// part is the share of a request that one node holds: a master of a
// cluster, or the one node of a backend (a single Redis, the master that
// Sentinel names). The parts of one request may sit on different
// backends: with a Redis for per-second limits (Options.PerSecond), a
// request's windows of under a minute go to that Redis's nodes, the
// others to the store's own (router.go).
type part struct {
	backend  *backend // the Redis whose node holds it
	addr     string   // the node's address ("" for a backend's one node)
	slot     int      // its one cluster slot, or -1 (a part per node: split)
	idx      []int    // positions in the request
	items    []engine.Item
	bases    []string
	results  []engine.Result
	reserved []engine.Item // what its latest reservation asked: items, or the same with groups told over (regroup)
	admitted bool
	reply    reply // its latest reservation's: the undo log (what release.lua gives back) and the view
	err      error
	released atomic.Bool // its reservation was given back (releaseAll)
}

// errRegroup is the error of a request whose quota group, split between
// nodes, was judged differently by a node's second look (concurrent
// requests changed its counters meanwhile): every reservation was given
// back.
var errRegroup = errors.New("redis: a quota group split between stores was judged differently on a second look; nothing consumed")

// applyParts decides a request spread over several parts: each part's
// node reserves its share (all-or-nothing locally), concurrently, and when
// the request as a whole is denied, every node that reserved gives back
// exactly what it took; the denied request's statuses then read as if
// nothing had been taken. The request is therefore never over-admitted; a
// concurrent request may see a reservation that is about to be released
// and be denied by it.
func (s *Store) applyParts(ctx context.Context, items []engine.Item, results []engine.Result, parts []*part) (bool, error) {
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(func() { s.reserve(ctx, p, p.items) })
	}
	wg.Wait()
	firstErr := gather(parts, results)
	// Each node judged its share whole; the rule over all the verdicts
	// decides.
	admitted, over := engine.Admit(items, results)
	admitted = admitted && firstErr == nil
	if admitted && over != nil {
		var err error
		if admitted, err = s.regroup(ctx, items, results, parts, over); err != nil {
			firstErr = err
		}
	}
	if !admitted {
		// Wait for the releases while the call's time lasts, so that the
		// next request sees nothing consumed; past it, they go on alone.
		select {
		case <-s.releaseAll(parts):
		case <-ctx.Done():
		}
		for _, p := range parts {
			if p.err == nil && p.admitted {
				unreserve(p, results)
				if !p.released.Load() || firstErr != nil {
					// Not given back (yet): its count-denied hits are still
					// counted. Or the request failed: it decided nothing, and
					// consumes nothing (it may be sent again: followSlots).
					continue
				}
				if err := s.chargeReleased(ctx, p, results); err != nil && firstErr == nil {
					firstErr = err
				}
			}
		}
	}
	if firstErr != nil {
		return false, firstErr
	}
	return admitted, nil
}

// reserve runs the decide function in modeReserve over items (the part's
// own, or the same with groups told over: regroup) and keeps the outcome
// in p.
func (s *Store) reserve(ctx context.Context, p *part, items []engine.Item) {
	p.reply, p.reserved = reply{}, items
	p.admitted, p.err = s.send(ctx, p.backend, p.addr, modeReserve, items, p.bases, p.results, &p.reply)
}

// gather copies the parts' results into the request's and returns the
// first part's error.
func gather(parts []*part, results []engine.Result) error {
	var firstErr error
	for _, p := range parts {
		if p.err != nil && firstErr == nil {
			firstErr = p.err
		}
		for j, i := range p.idx {
			results[i] = p.results[j]
		}
	}
	return firstErr
}

// regroup settles quota groups that parts judged apart. A quota group is
// one descriptor, whose windows share a cluster slot but may sit on two
// backends (a per-second window and a longer one): a part that saw only the
// admitting share of a group over as a whole reserved that share, which the
// rule does not consume. Such a part gives its reservation back and
// reserves again, telling its node which groups are over (a negative group
// on the wire): the node judges every item as before, as the items of one
// request see each other's tentative hits, and consumes none of those
// groups (their count-denied hits still count, as in a group that is over).
// The request stays admitted when every such part admits again, as each
// does unless a concurrent request took what it needs meanwhile; otherwise
// regroup returns false (with errRegroup when the second judgement changed
// which groups are over) and the caller gives every reservation back.
func (s *Store) regroup(ctx context.Context, items []engine.Item, results []engine.Result, parts []*part, over map[int32]bool) (bool, error) {
	var again []*part
	for _, p := range parts {
		if p.admitted && p.consumedOver(over) {
			again = append(again, p)
		}
	}
	if len(again) == 0 {
		return true, nil
	}
	var wg sync.WaitGroup
	for _, p := range again {
		wg.Go(func() {
			if err := s.release(p.backend, p.bases[0], p.reply.undo, p.bases); err != nil {
				// Its reservation may stand: it must not be given back
				// twice, nor read as decided.
				s.unknown(p.backend, p.addr, fmt.Errorf("giving back a quota group's share: %w", err))
				p.admitted, p.err = false, fmt.Errorf("redis: giving back a quota group's share: %w", err)
				return
			}
			s.releases.Add(1)
			s.regrouped.Add(1)
			told := slices.Clone(p.items)
			for j := range told {
				if g := told[j].Group; over[g] {
					told[j].Group = -g
				}
			}
			// Holds that ended by themselves were found by the first
			// reservation (its normalization stays): the second finds none.
			type ended struct {
				n    uint32
				hits uint64
			}
			lapsed := make([]ended, len(p.results))
			for j, r := range p.results {
				lapsed[j] = ended{r.Lapsed, r.LapsedHits}
			}
			s.reserve(ctx, p, told)
			for j := range p.results {
				p.results[j].Lapsed, p.results[j].LapsedHits = lapsed[j].n, lapsed[j].hits
			}
		})
	}
	wg.Wait()
	if err := gather(parts, results); err != nil {
		return false, err
	}
	admitted, over := engine.Admit(items, results)
	if !admitted {
		return false, nil
	}
	for _, p := range parts {
		if p.admitted && p.consumedOver(over) {
			return false, errRegroup
		}
	}
	return true, nil
}

// consumedOver reports whether p's latest reservation consumed items (hits,
// or hits given back) of quota groups that are over in the request as a
// whole but were not in p's share, nor told to p as over. Count-denied
// items do not count: their hits count in a group that is over too.
func (p *part) consumedOver(over map[int32]bool) bool {
	for j := range p.reserved {
		it := &p.reserved[j]
		consumes := it.Hits > 0 && !it.CountDenied || it.Reserving() // a reserve holds, however many hits it asks
		if it.Group > 0 && over[it.Group] && p.results[j].Admitted && consumes && !p.overHere(it.Group) {
			return true
		}
	}
	return false
}

// overHere reports whether quota group g is over in p's share alone: then
// p's node consumed none of it.
func (p *part) overHere(g int32) bool {
	for j := range p.items {
		if it := &p.items[j]; it.Group == g && !it.Shadow && !p.results[j].Admitted {
			return true
		}
	}
	return false
}

// releaseAll undoes the reservations of a denied request, in the
// background so that Apply can keep to its timeout, with a deadline of its
// own: a reservation left behind would deny others until its counters
// expire. The channel is closed when every release is done.
func (s *Store) releaseAll(parts []*part) <-chan struct{} {
	var wg sync.WaitGroup
	for _, p := range parts {
		if !p.admitted {
			continue
		}
		if len(p.reply.undo) == 0 {
			p.released.Store(true) // it took nothing
			continue
		}
		s.releasing.Add(1)
		wg.Go(func() {
			defer s.releasing.Done()
			if err := s.release(p.backend, p.bases[0], p.reply.undo, p.bases); err != nil {
				p.backend.log.Warn("redis: releasing a reservation failed; its counters stay consumed until they expire", "node", p.addr, "error", err)
				s.indeterminate.Add(1)
				return
			}
			p.released.Store(true)
			s.releases.Add(1)
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// release runs release.lua on b with an undo log that a decision wrote
// (on the node of key), then announces bases: another process may have
// cached a denial that what is given back caused. It has a deadline of its
// own.
func (s *Store) release(b *backend, key string, undo []any, bases []string) error {
	ctx, cancel := context.WithTimeout(s.releaseCtx, 10*s.opts.Timeout)
	defer cancel()
	args := append([]any{s.nowArg()}, undo...)
	for j, base := range bases {
		if !slices.Contains(bases[:j], base) {
			args = append(args, undoPublish, base)
		}
	}
	return b.conn.Call(ctx, lib.release, []string{key}, args...)
}

// unreserve sets the statuses of a part whose reservation was released to
// what the script reported for the state before the request (remaining
// and reset), as a request denied on one node reads.
func unreserve(p *part, results []engine.Result) {
	view := p.reply.view
	if len(view) != len(p.idx) {
		return
	}
	for j, i := range p.idx {
		results[i].Remaining = uint64(max(view[j].remaining, 0))
		results[i].Reset = time.Duration(view[j].reset) * time.Microsecond
	}
}

// chargeReleased counts again, on a node whose reservation was released,
// the hits of the part's count-denied items (count_denied_hits: they count
// whether or not the request is admitted, and the release took them back),
// and settles again its settles (a reservation call's settle happens
// whatever the request's outcome; its reserves hold nothing in a denied
// request), as memstore does in a denied request (modeCharge, with each
// item's verdict), and reports the statuses of every item on those
// counters from the state the charge left.
func (s *Store) chargeReleased(ctx context.Context, p *part, results []engine.Result) error {
	var charged []string
	for j, it := range p.items {
		if it.CountDenied && !it.Refund || it.Reserving() {
			charged = append(charged, p.bases[j])
		}
	}
	if len(charged) == 0 {
		return nil
	}
	var items []engine.Item
	var bases []string
	var idx []int
	for j, it := range p.items {
		if !slices.Contains(charged, p.bases[j]) {
			continue
		}
		if (!it.CountDenied || it.Refund) && !it.Reserving() {
			it.Hits, it.Refund, it.CountDenied, it.Reservation = 0, false, false, "" // a look, for its status
		}
		items, bases, idx = append(items, it), append(bases, p.bases[j]), append(idx, p.idx[j])
	}
	req := newRequest(modeCharge, s.nowArg(), s.now(), items, bases)
	for k, i := range idx {
		if !results[i].Admitted {
			req.items[k].flags |= flagDenied
		}
	}
	after := make([]engine.Result, len(items))
	if _, err := s.sendRequest(ctx, p.backend, p.addr, req, after, nil); err != nil {
		s.unknown(p.backend, p.addr, fmt.Errorf("charging count-denied hits after a release: %w", err))
		return err
	}
	for k, i := range idx {
		r, a := &results[i], &after[k]
		r.Remaining, r.Reset = a.Remaining, a.Reset
		if items[k].CountDenied && !items[k].Reserving() && !r.Admitted {
			r.RetryAfter = a.RetryAfter
			r.RemainingBeforeCharge = a.RemainingBeforeCharge
		}
		if items[k].Rule.Reserve != nil {
			// What the reservation calls did once the request was denied;
			// the holds ended by themselves were the reservation's (its
			// normalization stays).
			r.Phase, r.HoldHits, r.Held, r.Holds = a.Phase, a.HoldHits, a.Held, a.Holds
		}
	}
	return nil
}
