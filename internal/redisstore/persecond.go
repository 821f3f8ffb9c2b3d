package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// A store with a Redis for per-second limits (Options.PerSecond) keeps the
// counters of windows shorter than a minute there and the others on its
// own Redis, as envoyproxy/ratelimit's REDIS_PERSECOND keeps SECOND limits
// on a second Redis. The reference sends the two shares in two sequential
// pipelines, each key on its own; rls decides a request on both stores
// all-or-nothing, as across the masters of a cluster: each store's nodes
// reserve their share concurrently, and when the request is denied
// anywhere, every share is given back (applyParts).

// perSecondLimit reports whether l's counters live on the per-second Redis:
// a window shorter than a minute (unit: second with a unit_multiplier
// under 60). The window, not the unit, decides: it is part of the counter's
// identity (Rule.ID), so that limits sharing a counter (a configured
// window of 60 seconds and a request override of one minute) share a
// store too. A concurrency limit's window is its lease_ttl, which is not
// part of its identity: it stays on the main Redis whatever its lease_ttl,
// so that a reload that changes it keeps the acquisitions in flight.
func perSecondLimit(r *engine.Rule) bool {
	return r.WindowInIdentity() && r.Window < time.Minute
}

// newPerSecond returns the store of opts.PerSecond: its connection fields,
// and every other field from opts (which has its defaults).
func newPerSecond(opts Options) (*Store, error) {
	ps := *opts.PerSecond
	ps.PerSecond = nil
	ps.Prefix, ps.Timeout, ps.Now = opts.Prefix, opts.Timeout, opts.Now
	ps.DenyCache, ps.DenyCacheSize = opts.DenyCache, opts.DenyCacheSize
	ps.MaxBatch, ps.PerScript, ps.Workers, ps.minPipelineBound = opts.MaxBatch, opts.PerScript, opts.Workers, opts.minPipelineBound
	ps.Logger, ps.Tracer = opts.Logger.With("redis", "per-second"), opts.Tracer
	s, err := New(ps)
	if err != nil {
		return nil, fmt.Errorf("per-second Redis: %w", err)
	}
	return s, nil
}

// share is the items of a request whose counters one store holds.
type share struct {
	store   *Store
	idx     []int // positions in the request
	items   []engine.Item
	bases   []string
	results []engine.Result
	epoch   uint64 // the store's denial cache's, when it was asked
}

// applySplit decides a request on a store with a per-second Redis. Items of
// one store only: that store decides them as usual (one script per node).
// Items of both: the nodes of both reserve their shares concurrently
// (applyParts), and the request is all-or-nothing across them. Each
// store's denial cache answers for its own counters: a request is answered
// from memory when both know every one of their items to be denied.
func (s *Store) applySplit(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	shares := [2]share{{store: s}, {store: s.perSecond}}
	for i := range items {
		sh := &shares[0]
		if perSecondLimit(items[i].Rule) {
			sh = &shares[1]
		}
		sh.idx = append(sh.idx, i)
	}
	switch len(shares[1].idx) {
	case 0:
		return s.apply(ctx, items, results)
	case len(items):
		return s.perSecond.apply(ctx, items, results)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	sent := s.now()
	cached := s.cache != nil
	for k := range shares {
		sh := &shares[k]
		for _, i := range sh.idx {
			sh.items = append(sh.items, items[i])
			sh.bases = append(sh.bases, sh.store.base(&items[i]))
		}
		sh.results = make([]engine.Result, len(sh.items))
		if sh.store.cache != nil {
			var denied bool
			denied, sh.epoch = sh.store.cache.denyShare(sh.items, sh.bases, sh.results, sent)
			cached = cached && denied
		}
	}
	if s.cache != nil {
		s.cache.counted(cached) // one lookup of the request, as on one store
	}
	if cached {
		for _, sh := range shares {
			for j, i := range sh.idx {
				results[i] = sh.results[j]
			}
		}
		s.cacheHits.Add(1)
		s.cacheHit(ctx)
		return false, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		// As in apply: a caller without a deadline of its own.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pipelineBound(s.opts)+s.opts.Timeout)
		defer cancel()
	}
	admitted, err := followSlots(ctx, func(bySlot bool) (bool, []*part, error) {
		var parts []*part
		for _, sh := range shares {
			p, err := sh.store.split(ctx, sh.idx, sh.items, sh.bases, bySlot)
			if err != nil {
				return false, nil, err
			}
			parts = append(parts, p...)
		}
		ok, err := applyParts(ctx, items, results, parts)
		return ok, parts, err
	})
	if err != nil {
		s.errs.Add(1)
		if errors.Is(err, errExpired) {
			s.expired.Add(1)
		}
		return false, err
	}
	s.decisions.Add(1)
	for k := range shares {
		sh := &shares[k]
		if sh.store.cache == nil {
			continue
		}
		for j, i := range sh.idx {
			sh.results[j] = results[i]
		}
		sh.store.cache.remember(sh.items, sh.bases, sh.results, admitted, sent, sh.epoch)
	}
	return admitted, nil
}

// add returns the sum of two stores' counters.
func (st Stats) add(o Stats) Stats {
	return Stats{
		Decisions:     st.Decisions + o.Decisions,
		Scripts:       st.Scripts + o.Scripts,
		RoundTrips:    st.RoundTrips + o.RoundTrips,
		CacheHits:     st.CacheHits + o.CacheHits,
		Releases:      st.Releases + o.Releases,
		Errors:        st.Errors + o.Errors,
		Expired:       st.Expired + o.Expired,
		Resent:        st.Resent + o.Resent,
		GivenBack:     st.GivenBack + o.GivenBack,
		Indeterminate: st.Indeterminate + o.Indeterminate,
	}
}
