package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
)

var _ engine.Resetter = (*Store)(nil)

// resetBound bounds a Reset whose context has no deadline.
const resetBound = 5 * time.Second

// Reset implements engine.Resetter: per item, the counter's field of its
// descriptor's hash goes (HDEL), and a sliding log's sorted set (DEL), in
// one pipeline that also announces each counter on <prefix>freed, so that
// every process drops its cached denials of it. Counters of windows under a minute go to the
// per-second Redis when there is one. In a cluster each command goes to
// the master of its key's slot.
func (s *Store) Reset(ctx context.Context, items []engine.Item) (int, error) {
	if s.perSecond != nil {
		var mine, theirs []engine.Item
		for _, it := range items {
			if perSecondLimit(it.Rule) {
				theirs = append(theirs, it)
			} else {
				mine = append(mine, it)
			}
		}
		n, err := s.perSecond.reset(ctx, theirs)
		if err != nil {
			return n, err
		}
		m, err := s.reset(ctx, mine)
		return n + m, err
	}
	return s.reset(ctx, items)
}

// reset is Reset of items whose counters are all on s's nodes.
func (s *Store) reset(ctx context.Context, items []engine.Item) (int, error) {
	if len(items) == 0 {
		return 0, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, resetBound)
		defer cancel()
	}
	pipe := s.client.Pipeline()
	counts := make([]*redis.IntCmd, 0, 2*len(items))
	channel := engine.FreedChannel(s.opts.Prefix)
	for i := range items {
		it := &items[i]
		base := s.base(it)
		hash := engine.DescriptorKey(s.opts.Prefix, it.Desc)
		counts = append(counts, pipe.HDel(ctx, hash, it.Rule.ID), pipe.Del(ctx, base))
		if it.Rule.Penalized() {
			pipe.HDel(ctx, hash, engine.PenaltyField(it.Rule.ID)) // its strikes and block go too (not a counter of its own)
		}
		pipe.Publish(ctx, channel, base)
		if s.cache != nil {
			s.cache.freed(base)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("redis: reset: %w", err)
	}
	n := 0
	for _, c := range counts {
		n += int(c.Val())
	}
	return n, nil
}
