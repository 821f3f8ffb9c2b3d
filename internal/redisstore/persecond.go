package redisstore

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/redisconn"
)

// A store with a Redis for per-second limits (Options.PerSecond) keeps the
// counters of windows shorter than a minute there and the others on its
// own Redis, as envoyproxy/ratelimit's REDIS_PERSECOND keeps SECOND limits
// on a second Redis. The reference sends the two shares in two sequential
// pipelines, each key on its own; rls decides a request on both Redis
// all-or-nothing, as across the masters of a cluster: the two are
// backends of one router (router.go), whose nodes reserve their shares
// concurrently, and when the request is denied anywhere, every share is
// given back (applyParts).

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

// backend is one Redis deployment that holds counters: the store's own
// (Options.URL, its cluster or Sentinel's master), or the per-second Redis.
// Each has its connections (redisconn) and, with Options.DenyCache, a
// denial cache that follows the notices of its own Redis.
type backend struct {
	perSecond bool
	conn      *redisconn.Conn
	cache     *denyCache // nil without Options.DenyCache
	log       *slog.Logger
}

// newBackend connects (lazily) to the Redis of where's connection fields
// (the store's own Options, or its PerSecond), with the store's other
// options, and starts following its notices for the denial cache.
func (s *Store) newBackend(perSecond bool, where *Options) (*backend, error) {
	o := s.opts
	b := &backend{perSecond: perSecond, log: o.Logger}
	if perSecond {
		b.log = o.Logger.With("redis", "per-second")
	}
	if o.DenyCache {
		b.cache = newDenyCache(o.DenyCacheSize)
	}
	conn, err := redisconn.New(redisconn.Options{
		URL: where.URL, ClusterSeeds: where.ClusterSeeds, Sentinel: where.Sentinel,
		CAFile: where.CAFile, CertFile: where.CertFile, KeyFile: where.KeyFile, TLSSkipHostname: where.TLSSkipHostname,
		PoolSize: where.PoolSize,
		Timeout:  o.Timeout, MaxBatch: o.MaxBatch, PerScript: o.PerScript, Workers: o.Workers,
		Library: lib.source, Function: lib.decide,
		NoDeadlines: o.Now != nil, // the scripts run on the test clock
		Logger:      b.log, MinPipelineBound: o.minPipelineBound,
		OnLate:          func(l redisconn.Late) { s.late(b, l) },
		OnIndeterminate: func(node string, err error) { s.unknown(b, node, err) },
		OnMasterChange:  b.masterChanged,
	})
	if err != nil {
		return nil, b.named(err)
	}
	b.conn = conn
	if b.cache != nil {
		s.watching.Go(func() { s.watchFreed(b) })
	}
	return b, nil
}

// named returns err of b's Redis, named when it is the per-second one.
func (b *backend) named(err error) error {
	if b.perSecond {
		return fmt.Errorf("per-second Redis: %w", err)
	}
	return err
}

// masterChanged is told that Sentinel's master is another node now (a
// failover): the denial cache starts empty and stays off until its
// subscription is confirmed on the new master (replication is
// asynchronous: hits the former master counted, and notices it published,
// may never have reached the new one).
func (b *backend) masterChanged(from, to string) {
	if b.cache != nil {
		b.cache.setLive(false)
	}
}
