package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/lease"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/redisconn"
	"github.com/rlsproject/rls/internal/redisstore"
)

// RedisParts are what front ends may read of a Redis store (Parts.Redis),
// as typed values: the store they get (Parts.Store) is the lease layer
// over it, which they need not look under.
type RedisParts struct {
	// DenyCache reads the denial cache's counters; nil when the store has
	// no denial cache (or is not on Redis).
	DenyCache func() redisstore.DenyCacheStats
	// Board is the board on the store's Redis where the processes sharing
	// it publish what they see (the top keys' summaries); nil off Redis.
	Board *redisstore.Board
	// Nodes pings each node of the store's Redis (redisstore.Store.Nodes);
	// nil off Redis.
	Nodes func(ctx context.Context) []redisconn.NodeHealth
}

// newStore builds the store of c, registers its metrics on reg and returns
// what front ends may read of a Redis store, where the runtime overrides
// are kept (beside the counters: in Redis, or in this process with the
// file of c.OverridesFile) and a function that closes it. A Redis store's
// errors are named by name.
func newStore(ctx context.Context, c Store, name string, reg prometheus.Registerer, log *slog.Logger) (engine.Store, RedisParts, overrides.Backend, func(), error) {
	if c.Kind != Redis {
		ob, err := overrides.NewMemory(c.OverridesFile, c.Memory.Now)
		if err != nil {
			return nil, RedisParts{}, nil, nil, fmt.Errorf("overrides file: %w", err)
		}
		s := memstore.New(c.Memory)
		reg.MustRegister(s.Collectors()...)
		return s, RedisParts{}, ob, func() { s.Close() }, nil
	}
	// go-redis logs through a logger of its own (process-wide): send it to
	// ours, at a bounded rate, so that a Redis outage does not flood stderr.
	redis.SetLogger(&redisLogger{log: log, every: rate.Sometimes{Interval: 10 * time.Second}})
	opts := c.Redis
	opts.Logger = log
	s, err := redisstore.New(opts)
	if err != nil {
		return nil, RedisParts{}, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.Warm(pctx); err != nil {
		// Serve anyway: /readyz says not ready, the store-error policy
		// decides what requests get, and the store reconnects by itself.
		log.Warn("Redis does not answer yet", "error", err)
	}
	reg.MustRegister(s.Collectors()...)
	// Leased limits are decided from slices of the shared counters.
	leased := lease.New(s, lease.Options{StoreTimeout: s.DecisionTimeout(), Logger: log})
	reg.MustRegister(leased.Collectors()...)
	parts := RedisParts{Board: s.Board("top"), Nodes: s.Nodes}
	if _, on := s.DenyCacheStats(); on {
		parts.DenyCache = func() redisstore.DenyCacheStats {
			st, _ := s.DenyCacheStats()
			return st
		}
	}
	return leased, parts, s.Overrides(), func() {
		leased.Close() // gives back the slices' unused hits, to s
		s.Close()
	}, nil
}

// redisLogger adapts go-redis's logging to slog.
type redisLogger struct {
	log   *slog.Logger
	every rate.Sometimes
}

func (l *redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.every.Do(func() { l.log.Warn("redis client: " + fmt.Sprintf(format, v...)) })
}
