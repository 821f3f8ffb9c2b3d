package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
)

// nodePart is the share of a request that one cluster master holds.
type nodePart struct {
	addr     string // the master's address
	idx      []int  // positions in the request
	items    []engine.Item
	bases    []string
	results  []engine.Result
	admitted bool
	rest     []any // mode R, admitted: the undo log and view, as the script returns them
	undo     []any // what release.lua gives back
	view     []any // per item remaining and reset µs before the request
	err      error
	released atomic.Bool // its reservation was given back (releaseAll)
}

// oneSlot reports whether all items are counters of one descriptor, whose
// keys share its hash tag and so one cluster slot.
func oneSlot(items []engine.Item) bool {
	for i := range items {
		if items[i].Desc != items[0].Desc {
			return false
		}
	}
	return true
}

// applyCluster decides a request whose counters may sit on several masters.
// One master: the script decides it whole. Several: each master reserves
// its part (all-or-nothing locally), and when the request as a whole is
// denied, every master that reserved gives back exactly what it took. The
// request is therefore never over-admitted; a concurrent request may see a
// reservation that is about to be released and be denied by it.
func (s *Store) applyCluster(ctx context.Context, items []engine.Item, bases []string, results []engine.Result) (bool, error) {
	parts, err := s.split(ctx, items, bases)
	if err != nil {
		return false, err
	}
	if len(parts) == 1 {
		mode := modeFinal // its keys may sit in several slots of that master: read one by one
		if oneSlot(items) {
			mode = modeFinalMGET
		}
		var addr string
		for a := range parts {
			addr = a
		}
		return s.retryMoved(ctx, func() (bool, error) { return s.applyNode(ctx, addr, mode, items, bases, results, nil) })
	}
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(func() {
			p.admitted, p.err = s.retryMoved(ctx, func() (bool, error) {
				return s.applyNode(ctx, p.addr, modeReserve, p.items, p.bases, p.results, &p.rest)
			})
		})
	}
	wg.Wait()
	for _, p := range parts {
		if len(p.rest) == 2 {
			p.undo, _ = p.rest[0].([]any)
			p.view, _ = p.rest[1].([]any)
		}
	}

	var firstErr error
	for _, p := range parts {
		if p.err != nil && firstErr == nil {
			firstErr = p.err
		}
		for j, i := range p.idx {
			results[i] = p.results[j]
		}
	}
	// Each node judged its part whole (a quota group is one descriptor,
	// hence on one node); the rule over all the verdicts decides.
	admitted, _ := engine.Admit(items, results)
	admitted = admitted && firstErr == nil
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
				if !p.released.Load() {
					continue // not given back (yet): its count-denied hits are still counted
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

// split groups the items by the master that owns their slot.
func (s *Store) split(ctx context.Context, items []engine.Item, bases []string) (map[string]*nodePart, error) {
	parts := make(map[string]*nodePart)
	for i := range items {
		node, err := s.cluster.MasterForKey(ctx, bases[i])
		if err != nil {
			return nil, fmt.Errorf("redis cluster: slot of %q: %w", bases[i], err)
		}
		addr := node.Options().Addr
		p := parts[addr]
		if p == nil {
			p = &nodePart{addr: addr}
			parts[addr] = p
		}
		p.idx = append(p.idx, i)
		p.items = append(p.items, items[i])
		p.bases = append(p.bases, bases[i])
		p.results = append(p.results, engine.Result{})
	}
	return parts, nil
}

// retryMoved runs f again once, with a fresh slot map, when a script met a
// key that is no longer local to the node it was sent to (resharding or a
// failover in progress).
func (s *Store) retryMoved(ctx context.Context, f func() (bool, error)) (bool, error) {
	ok, err := f()
	if err == nil || !clusterMoved(err) {
		return ok, err
	}
	// ReloadState only schedules a reload; ForEachMaster waits for the new
	// slot map.
	s.cluster.ReloadState(ctx)
	s.cluster.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
	return f()
}

func clusterMoved(err error) bool {
	msg := err.Error()
	for _, s := range []string{"non local key", "CROSSSLOT", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// releaseAll undoes the reservations of a denied request, in the
// background so that Apply can keep to its timeout, with a deadline of its
// own: a reservation left behind would deny others until its counters
// expire. The channel is closed when every release is done.
func (s *Store) releaseAll(parts map[string]*nodePart) <-chan struct{} {
	var wg sync.WaitGroup
	for _, p := range parts {
		if !p.admitted {
			continue
		}
		if len(p.undo) == 0 {
			p.released.Store(true) // it took nothing
			continue
		}
		s.releasing.Add(1)
		wg.Go(func() {
			defer s.releasing.Done()
			if err := s.release(p.bases[0], p.undo, p.bases); err != nil {
				s.log.Warn("redis cluster: releasing a reservation failed; its counters stay consumed until they expire", "error", err)
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

// release runs release.lua with an undo log that decide.lua wrote (on the
// node of key), then announces bases: another process may have cached a
// denial that what is given back caused. It has a deadline of its own.
func (s *Store) release(key string, undo []any, bases []string) error {
	ctx, cancel := context.WithTimeout(s.releaseCtx, 10*s.opts.Timeout)
	defer cancel()
	args := []any{s.nowArg()}
	for _, op := range undo {
		f, _ := op.([]any)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case undoWindow, undoTAT:
			args = append(args, f...)
		case undoZRem:
			args = append(args, f[0], f[1], len(f)-2)
			args = append(args, f[2:]...)
		case undoZAdd:
			args = append(args, f[0], f[1], f[2], len(f)-3)
			args = append(args, f[3:]...)
		}
	}
	for j, b := range bases {
		if !slices.Contains(bases[:j], b) {
			args = append(args, undoPublish, b)
		}
	}
	if err := lib.fcall(ctx, s.client, lib.release, []string{key}, args...).Err(); err != nil && err != redis.Nil {
		return err
	}
	return nil
}

// unreserve sets the statuses of a part whose reservation was released to
// what the script reported for the state before the request (remaining
// and reset), as a request denied on one node reads.
func unreserve(p *nodePart, results []engine.Result) {
	if len(p.view) != 2*len(p.idx) {
		return
	}
	for j, i := range p.idx {
		rem, _ := p.view[2*j].(int64)
		reset, _ := p.view[2*j+1].(int64)
		results[i].Remaining = uint64(max(rem, 0))
		results[i].Reset = time.Duration(reset) * time.Microsecond
	}
}

// chargeReleased counts again, on a node whose reservation was released,
// the hits of the part's count-denied items (count_denied_hits: they count
// whether or not the request is admitted, and the release took them back),
// as memstore charges them in a denied request (modeCharge, with each
// item's verdict), and reports the statuses of every item on those
// counters from the state the charge left.
func (s *Store) chargeReleased(ctx context.Context, p *nodePart, results []engine.Result) error {
	var charged []string
	for j, it := range p.items {
		if it.CountDenied && !it.Refund {
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
		if !it.CountDenied || it.Refund {
			it.Hits, it.Refund, it.CountDenied = 0, false, false // a look, for its status
		}
		items, bases, idx = append(items, it), append(bases, p.bases[j]), append(idx, p.idx[j])
	}
	args := requestArgs(modeCharge, s.nowArg(), s.now(), items, bases)
	for k, i := range idx {
		if !results[i].Admitted {
			f := requestHead + k*itemFields + itemFlags - 1
			args[f] = args[f].(int) | flagDenied
		}
	}
	after := make([]engine.Result, len(items))
	reply, err := s.b.do(ctx, p.addr, len(items), []string{bases[0]}, args)
	if err == nil {
		_, err = readReply(reply, items, after, nil)
	}
	if err != nil {
		s.unknown(p.addr, fmt.Errorf("charging count-denied hits after a release: %w", err))
		return err
	}
	for k, i := range idx {
		results[i].Remaining, results[i].Reset = after[k].Remaining, after[k].Reset
		if items[k].CountDenied && !results[i].Admitted {
			results[i].RetryAfter = after[k].RetryAfter
			results[i].RemainingBeforeCharge = after[k].RemainingBeforeCharge
		}
	}
	return nil
}
