package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/redisconn"
)

// Options configure a Store.
type Options struct {
	// URL is a redis:// or rediss:// (TLS) URL, with user and password in
	// it. In cluster mode its credentials and TLS settings apply to every
	// node and its host is ignored.
	URL string
	// ClusterSeeds, when not empty, are host:port seeds of a Redis Cluster.
	ClusterSeeds []string
	// Sentinel, when not nil, names a master that Redis Sentinel watches:
	// rls asks the sentinels where it is and follows failovers. The URL
	// then gives the master's credentials, database and TLS; its host is
	// ignored. Not with ClusterSeeds.
	Sentinel *Sentinel
	// PerSecond, when not nil, is a second Redis (single, Sentinel or
	// cluster) for the counters of windows shorter than a minute, as
	// envoyproxy/ratelimit's REDIS_PERSECOND sends per-second limits to a
	// second Redis. A request on both stays all-or-nothing (router.go).
	// Only its connection fields count (URL, ClusterSeeds, Sentinel,
	// CAFile, CertFile, KeyFile, TLSSkipHostname, PoolSize); the others are
	// this Options'.
	PerSecond *Options
	// CAFile is a PEM file of the CAs that sign the servers' certificates,
	// for rediss:// with a private CA; empty means the system's roots.
	CAFile string
	// CertFile and KeyFile, when set, are PEM files of a client certificate
	// that rls presents to Redis (mutual TLS: Redis's tls-auth-clients),
	// read again at every handshake so that a rotated certificate is used
	// from the next connection on.
	CertFile, KeyFile string
	// TLSSkipHostname verifies Redis's certificate chain but not that it
	// names the host rls reaches (tlsfiles.ClientFiles.SkipHostname), as
	// envoyproxy/ratelimit's REDIS_TLS_SKIP_HOSTNAME_VERIFICATION; New logs
	// a warning.
	TLSSkipHostname bool
	// Prefix starts every key; default "rls:".
	Prefix string
	// PoolSize is the number of connections per node for all but the
	// decisions (reading clocks, pings, giving back, loading the library);
	// 0 means go-redis's default (10 per CPU). The decisions' pipelines
	// have one connection per worker per node of their own (redisconn).
	PoolSize int
	// Timeout is how long Redis has to decide a request once it is sent
	// (default 10ms): past it the script decides nothing, and the caller
	// waits for the reply half as long again at most. Time queued in the
	// process before sending does not count; a caller's context deadline
	// bounds everything.
	Timeout time.Duration
	// DenyCache answers requests that Redis said are denied until an exact
	// instant from memory until then.
	DenyCache bool
	// DenyCacheSize bounds the denial cache's entries (default 100000).
	DenyCacheSize int
	// Now is the store's one test seam (for tests only; nil in
	// production): the scripts decide at this clock's readings, sent with
	// each request, instead of Redis TIME, with a day added to every
	// expiry (see the test seam in scripts/prelude.lua); deadlines are not
	// stamped.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
	// MaxBatch bounds the requests sent in one round trip (default 128).
	MaxBatch int
	// PerScript bounds the requests one FCALL decides on a single node
	// (default 32; 1 sends every request as its own FCALL). In cluster mode
	// every request is its own FCALL.
	PerScript int
	// Workers is the number of pipelines in flight at once (default 4).
	// Fewer workers put more decisions in each round trip.
	Workers int
	// Tracer, when not nil, makes a span of each trip to Redis that a
	// recorded span led to (tracing.go); nil makes none, at no cost.
	Tracer trace.Tracer

	// minPipelineBound, for tests on a starved machine: the least time a
	// pipeline's replies are waited for (redisconn.Options.MinPipelineBound).
	minPipelineBound time.Duration
}

// Sentinel names a master that Redis Sentinel watches (Options.Sentinel).
type Sentinel = redisconn.Sentinel

// withDefaults returns o with its defaults.
func (o Options) withDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = "rls:"
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Millisecond
	}
	if o.DenyCacheSize <= 0 {
		o.DenyCacheSize = 100_000
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Stats are the store's counters since it started.
type Stats struct {
	Decisions  uint64 // Apply calls answered by Redis
	Scripts    uint64 // FCALLs sent (decide)
	RoundTrips uint64 // pipelines sent
	CacheHits  uint64 // Apply calls answered from the denial cache
	Releases   uint64 // reservations undone (cluster masters, per-second Redis)
	Errors     uint64 // Apply calls that failed
	// Expired counts requests that Redis did not decide because they
	// reached it after their deadline: nothing consumed.
	Expired uint64
	// Resent counts sends of requests that Redis had refused as past their
	// deadline, sent again while their callers still waited.
	Resent uint64
	// GivenBack counts decisions whose replies came after their callers
	// had stopped waiting, and whose consumption was given back.
	GivenBack uint64
	// Indeterminate counts requests that may have consumed without their
	// callers hearing of it and that the store could not give back: sent
	// with no reply (a broken connection, or one silent past the drain
	// bound), or a late reply
	// decided too early to carry its undo log, or a give-back that failed.
	Indeterminate uint64
}

// Store is the Redis engine.Store. It is safe for concurrent use; Close
// releases its connections and workers.
type Store struct {
	opts Options
	// backends are the Redis deployments that hold the counters: the one
	// of Options.URL (or its cluster, or Sentinel's master), and with
	// Options.PerSecond the per-second Redis (router.go).
	backends []*backend
	log      *slog.Logger

	decisions, cacheHits, releases, errs atomic.Uint64
	expired, givenBack, indeterminate    atomic.Uint64
	regrouped                            atomic.Uint64  // quota groups settled again (regroup)
	faultLog                             rate.Sometimes // late and indeterminate outcomes
	closeOnce                            sync.Once

	// What runs after Apply returns: the releases of reservations and of
	// late replies, counted in releasing; the denial caches'
	// subscriptions, in watching. releaseCtx ends them.
	releaseCtx   context.Context
	stopReleases context.CancelFunc
	releasing    sync.WaitGroup
	watching     sync.WaitGroup
}

var _ engine.Store = (*Store)(nil)

// New connects lazily: it returns an error only for bad options, not for an
// unreachable Redis (Warm connects, Ping says whether Redis answers, for
// readiness).
func New(opts Options) (*Store, error) {
	opts = opts.withDefaults()
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redis prefix %q: braces would break the cluster hash tag", opts.Prefix)
	}
	s := &Store{opts: opts, log: opts.Logger, faultLog: rate.Sometimes{Interval: 10 * time.Second}}
	s.releaseCtx, s.stopReleases = context.WithCancel(context.Background())
	redises := []*Options{&opts}
	if opts.PerSecond != nil {
		redises = append(redises, opts.PerSecond)
	}
	for i, where := range redises {
		b, err := s.newBackend(i > 0, where)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.backends = append(s.backends, b)
	}
	return s, nil
}

// Close stops the workers and closes the connections. Idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		// The pipelines first: they read the replies in flight (for a
		// pipeline's bound at most), and late ones are given back, as are
		// reservations, before releases stop.
		for _, b := range s.backends {
			b.conn.Drain()
		}
		s.releasing.Wait()
		s.stopReleases()
		s.watching.Wait()
		for _, b := range s.backends {
			err = errors.Join(err, b.conn.Close())
		}
	})
	return err
}

// Ping checks that Redis answers (in cluster mode, every master; and the
// per-second Redis) and that the pipelines can send to it: every worker's
// connection set up (redisconn.Conn.Ping). A node that does not accept
// connections fails it at once.
func (s *Store) Ping(ctx context.Context) error {
	for _, b := range s.backends {
		if err := b.conn.Ping(ctx); err != nil {
			return b.named(err)
		}
	}
	return nil
}

// Warm readies the store before its first requests: it sets up every
// connection the pipelines need (one per worker, on every master: dial,
// handshakes, each node's clock) and loads the function library, so that
// the first requests spend none of their deadlines on it. It returns the
// first error of each Redis (with a per-second one).
func (s *Store) Warm(ctx context.Context) error {
	var errs []error
	for _, b := range s.backends {
		if err := b.conn.Warm(ctx); err != nil {
			errs = append(errs, b.named(err))
		}
	}
	return errors.Join(errs...)
}

// DecisionTimeout is how long Redis has to decide a request once it is
// sent (Options.Timeout): past it the request decides nothing.
func (s *Store) DecisionTimeout() time.Duration { return s.opts.Timeout }

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Decisions:     s.decisions.Load(),
		CacheHits:     s.cacheHits.Load(),
		Releases:      s.releases.Load(),
		Errors:        s.errs.Load(),
		Expired:       s.expired.Load(),
		GivenBack:     s.givenBack.Load(),
		Indeterminate: s.indeterminate.Load(),
	}
	for _, b := range s.backends {
		c := b.conn.Stats()
		st.Scripts += c.Scripts
		st.RoundTrips += c.RoundTrips
		st.Resent += c.Resent
	}
	return st
}

func (s *Store) now() time.Time {
	if s.opts.Now != nil {
		return s.opts.Now()
	}
	return time.Now()
}

// nowArg is the scripts' instant argument: "" for Redis TIME, the test
// clock's reading in µs on a store with Options.Now.
func (s *Store) nowArg() string {
	if s.opts.Now == nil {
		return ""
	}
	return strconv.FormatInt(s.opts.Now().UnixMicro(), 10)
}

// base returns the key of an item's counter: the prefix, the descriptor's
// identity as the hash tag, the limit's counter ID.
func (s *Store) base(it *engine.Item) string {
	return engine.CounterKey(s.opts.Prefix, it.Desc, it.Rule)
}

// late handles the reply of a request whose caller stopped waiting (its
// own deadline, or the store's wait): what it consumed (an admission, or a
// denial's hits that count when denied) is given back with its undo log;
// without one (decided well before its deadline, so the reply took longer
// than a whole timeout on its way back) it is indeterminate.
func (s *Store) late(b *backend, l redisconn.Late) {
	req := l.Request.(*request) // the store's own, back from the driver
	r, err := parseReply(l.Reply, len(req.items), req.holds)
	if err != nil {
		s.unknown(b, l.Node, fmt.Errorf("a reply came after its caller stopped waiting, unreadable: %w", err))
		return
	}
	switch r.verdict {
	case verdictExpired:
		s.expired.Add(1)
		return
	case verdictAdmitted:
	default:
		if !req.chargesDenied() {
			return // denied: nothing consumed
		}
	}
	undo, bases := r.undo, req.bases()
	switch {
	case undo == nil:
		s.unknown(b, l.Node, errors.New("a reply came after its caller stopped waiting, decided too early to carry its undo log"))
		return
	case len(undo) == 0:
		return // nothing written
	}
	s.releasing.Go(func() {
		if err := s.release(b, l.Keys[0], undo, bases); err != nil {
			s.unknown(b, l.Node, fmt.Errorf("giving back a late decision: %w", err))
			return
		}
		s.givenBack.Add(1)
	})
}

// unknown counts a request whose consumption, if any, could not be told
// or given back, and logs it at a bounded rate.
func (s *Store) unknown(b *backend, node string, err error) {
	n := s.indeterminate.Add(1)
	s.faultLog.Do(func() {
		b.log.Warn("redis: a request may have consumed without rls answering it (counted in rls_redis_indeterminate_total)",
			"node", node, "error", err, "indeterminate_so_far", n)
	})
}
