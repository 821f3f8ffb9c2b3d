package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Notices of hits given back (see denyCache) and how the store follows them.
const (
	// freedPing is how long the subscription may stay silent before it is
	// pinged; with no answer by the next one, it is replaced.
	freedPing = 5 * time.Second
	// freedRetry is the pause before subscribing again after a failure.
	freedRetry = 200 * time.Millisecond
)

// watchFreed keeps a subscription to <prefix>freed until the store closes
// and drops the cached denial of every counter announced there. The cache
// keeps entries only while the subscription is known to be live: a broken
// connection, a Redis restart or a silent one (no answer to a ping) clears
// it until the subscription is confirmed again.
func (s *Store) watchFreed() {
	defer s.watching.Done()
	ctx := s.releaseCtx
	channel := s.opts.Prefix + "freed"
	for ctx.Err() == nil {
		ps := s.client.Subscribe(ctx, channel)
		stop := context.AfterFunc(ctx, func() { ps.Close() }) // ends a blocked read
		err := s.followFreed(ctx, ps)
		stop()
		ps.Close()
		if s.cache.isLive() {
			s.log.Warn("redis: lost the subscription to "+channel+"; the denial cache is off until it is back", "error", err)
		}
		s.cache.setLive(false)
		select {
		case <-ctx.Done():
		case <-time.After(freedRetry):
		}
	}
}

// followFreed reads ps until it fails or stays silent through a ping.
func (s *Store) followFreed(ctx context.Context, ps *redis.PubSub) error {
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, freedPing)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if !isTimeout(err) || pinged {
				return err
			}
			if err := ps.Ping(ctx); err != nil {
				return err
			}
			pinged = true
			continue
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				s.cache.setLive(true)
			}
		case *redis.Message:
			s.cache.freed(m.Payload)
		}
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
