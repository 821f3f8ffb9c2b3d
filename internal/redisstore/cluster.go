package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
)

// applyCluster decides a request whose counters may sit on several masters.
// One master: the script decides it whole. Several: each master reserves
// its part (applyParts).
func (s *Store) applyCluster(ctx context.Context, items []engine.Item, bases []string, results []engine.Result) (bool, error) {
	parts, err := s.split(ctx, nil, items, bases)
	if err != nil {
		return false, err
	}
	if len(parts) == 1 {
		addr := parts[0].addr
		return s.retryMoved(ctx, func() (bool, error) { return s.applyNode(ctx, addr, modeFinal, items, bases, results, nil) })
	}
	return applyParts(ctx, items, results, parts)
}

// split groups items (at positions idx of their request; nil: 0, 1, ...)
// into parts of s: one per master that owns their slots, or one for the
// store's one node.
func (s *Store) split(ctx context.Context, idx []int, items []engine.Item, bases []string) ([]*part, error) {
	var parts []*part
	for i := range items {
		addr := ""
		if s.cluster != nil {
			node, err := s.cluster.MasterForKey(ctx, bases[i])
			if err != nil {
				return nil, fmt.Errorf("redis cluster: slot of %q: %w", bases[i], err)
			}
			addr = node.Options().Addr
		}
		k := slices.IndexFunc(parts, func(p *part) bool { return p.addr == addr })
		if k < 0 {
			k = len(parts)
			parts = append(parts, &part{store: s, addr: addr})
		}
		p := parts[k]
		at := i
		if idx != nil {
			at = idx[i]
		}
		p.idx = append(p.idx, at)
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
	if err == nil || s.cluster == nil || !clusterMoved(err) {
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
