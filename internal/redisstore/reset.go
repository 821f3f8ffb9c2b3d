package redisstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
)

// resetBound bounds a Reset whose context has no deadline.
const resetBound = 5 * time.Second

// Reset implements engine.Store: per item, the counter's field of its
// descriptor's hash goes (HDEL), and a sliding log's sorted set (DEL), and
// a counter's reservations (their field and keys), in
// one pipeline per backend that also announces each counter on
// <prefix>freed, so that every process drops its cached denials of it.
// Counters of windows under a minute go to the per-second Redis when there
// is one (route). In a cluster each command goes to the master of its
// key's slot.
func (s *Store) Reset(ctx context.Context, items []engine.Item) (int, error) {
	r := s.route(items)
	n := 0
	for k, b := range s.backends {
		m, err := s.reset(ctx, b, r.shares[k].items, r.shares[k].bases)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// reset is Reset of items whose counters (bases) are all on b.
func (s *Store) reset(ctx context.Context, b *backend, items []engine.Item, bases []string) (int, error) {
	if len(items) == 0 {
		return 0, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, resetBound)
		defer cancel()
	}
	pipe := b.conn.Client().Pipeline()
	counts := make([][]*redis.IntCmd, len(items)) // per item, what held its state
	channel := engine.FreedChannel(s.opts.Prefix)
	for i := range items {
		it, base := &items[i], bases[i]
		hash := engine.DescriptorKey(s.opts.Prefix, it.Desc)
		counts[i] = append(counts[i], pipe.HDel(ctx, hash, it.Rule.ID), pipe.Del(ctx, base))
		if it.Rule.Penalized() {
			pipe.HDel(ctx, hash, engine.PenaltyField(it.Rule.ID)) // its strikes and block go too (not a counter of its own)
		}
		if it.Rule.Reserve != nil {
			// Its reservations go too: their holds and the ids it remembers
			// (a log that only holds has no entries).
			records, events := engine.ReservationKeys(base)
			counts[i] = append(counts[i], pipe.HDel(ctx, hash, engine.HeldField(it.Rule.ID)), pipe.Del(ctx, records, events))
		}
		pipe.Publish(ctx, channel, base)
		if b.cache != nil {
			b.cache.freed(base)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("redis: reset: %w", err)
	}
	n := 0
	for _, cmds := range counts {
		if slices.ContainsFunc(cmds, func(c *redis.IntCmd) bool { return c.Val() > 0 }) {
			n++
		}
	}
	return n, nil
}
