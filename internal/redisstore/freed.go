package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rlsproject/rls/internal/engine"
)

// Notices of hits given back (see denyCache) and how the store follows them.
const (
	// freedPing is how long the subscription may stay silent before it is
	// pinged; with no answer by the next one, it is replaced.
	freedPing = 5 * time.Second
	// freedRetry is the first pause before subscribing again after a
	// failure; it doubles up to freedMaxRetry while the failures last.
	freedRetry    = 200 * time.Millisecond
	freedMaxRetry = 5 * time.Second
)

// watchFreed keeps a subscription to <prefix>freed until the store closes
// and drops the cached denial of every counter announced there. The cache
// keeps entries only while the subscription is known to be live: a broken
// connection, a Redis restart, a silent one (no answer to a ping) or an
// account without the channel's permission keeps it empty until the
// subscription is confirmed again. Each loss is logged once; attempts back
// off to freedMaxRetry.
func (s *Store) watchFreed() {
	defer s.watching.Done()
	ctx := s.releaseCtx
	channel := engine.FreedChannel(s.opts.Prefix)
	wait, warned := freedRetry, false
	for ctx.Err() == nil {
		ps := s.client.Subscribe(ctx, channel)
		stop := context.AfterFunc(ctx, func() { ps.Close() }) // ends a blocked read
		moved := s.onMasterMove(func() { ps.Close() })        // a failover: subscribe on the new master
		err := s.followFreed(ctx, ps)
		stop()
		moved()
		ps.Close()
		if ctx.Err() != nil {
			return
		}
		if s.cache.isLive() {
			wait, warned = freedRetry, false
		}
		s.cache.setLive(false)
		if !warned {
			s.log.Warn(freedLost(channel, err), "error", err)
			warned = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, freedMaxRetry)
	}
}

// freedLost is the warning of a subscription to channel that failed with
// err: Redis refused the account the channel (ACLs), or the connection
// failed or was lost (Redis down, restarted, unreachable or silent).
func freedLost(channel string, err error) string {
	if redis.IsPermissionError(err) {
		return "redis: the account may not subscribe to " + channel + " (with ACLs it needs &" + channel + "); the denial cache is off until it may"
	}
	if isRedisError(err) {
		return "redis: Redis refused the subscription to " + channel + "; the denial cache is off until it takes it"
	}
	return "redis: the subscription to " + channel + " failed or was lost with its connection to Redis; the denial cache is off until it is back"
}

// followFreed reads ps until it fails or stays silent through a ping.
func (s *Store) followFreed(ctx context.Context, ps *redis.PubSub) error {
	return receive(ctx, ps, freedPing, func(msg any) {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				s.cache.setLive(true)
			}
		case *redis.Message:
			s.cache.freed(m.Payload)
		}
	})
}

// receive hands each message of ps to handle until ps fails, or stays
// silent for ping twice: it is pinged after the first silence.
func receive(ctx context.Context, ps *redis.PubSub, ping time.Duration, handle func(msg any)) error {
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, ping)
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
		handle(msg)
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
