package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/redisconn"
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

// watchFreed keeps a subscription to <prefix>freed on b's Redis until the
// store closes and drops the cached denial of every counter announced
// there from b's cache. The cache
// keeps entries only while the subscription is known to be live: a broken
// connection, a Redis restart, a silent one (no answer to a ping) or an
// account without the channel's permission keeps it empty until the
// subscription is confirmed again. Each loss is logged once; attempts back
// off to freedMaxRetry.
func (s *Store) watchFreed(b *backend) {
	ctx := s.releaseCtx
	channel := engine.FreedChannel(s.opts.Prefix)
	wait, warned := freedRetry, false
	for ctx.Err() == nil {
		ps := b.conn.Client().Subscribe(ctx, channel)
		stop := context.AfterFunc(ctx, func() { ps.Close() }) // ends a blocked read
		moved := b.conn.OnMasterMove(func() { ps.Close() })   // a failover: subscribe on the new master
		err := followFreed(ctx, b.cache, ps)
		stop()
		moved()
		ps.Close()
		if ctx.Err() != nil {
			return
		}
		if b.cache.isLive() {
			wait, warned = freedRetry, false
		}
		b.cache.setLive(false)
		if !warned {
			b.log.Warn(freedLost(channel, err), "error", err)
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
	if redisconn.IsRedisError(err) {
		return "redis: Redis refused the subscription to " + channel + "; the denial cache is off until it takes it"
	}
	return "redis: the subscription to " + channel + " failed or was lost with its connection to Redis; the denial cache is off until it is back"
}

// followFreed reads ps, the subscription of cache, until it fails or stays
// silent through a ping.
func followFreed(ctx context.Context, cache *denyCache, ps *redis.PubSub) error {
	return redisconn.Receive(ctx, ps, freedPing, func(msg any) {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				cache.setLive(true)
			}
		case *redis.Message:
			cache.freed(m.Payload)
		}
	})
}
