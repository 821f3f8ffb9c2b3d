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

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/tlsfiles"
	"github.com/rlsproject/rls/internal/tracing/spans"
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
	// second Redis. A request on both stays all-or-nothing (applySplit).
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
	// have one connection per worker per node of their own (see links).
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
	// pipeline's replies are waited for (default 100 ms; see pipelineBound).
	minPipelineBound time.Duration
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
	client  redis.UniversalClient
	cluster *redis.ClusterClient // nil for a single node
	master  *masterWatch         // with Sentinel: which node the client reaches
	// perSecond is the store of windows under a minute (Options.PerSecond),
	// or nil.
	perSecond *Store
	opts      Options
	b         *batcher
	links     *links
	cache     *denyCache
	log       *slog.Logger

	clock *redisClock // nil when the scripts run on the test clock (Options.Now)

	decisions, cacheHits, releases, errs atomic.Uint64
	expired, givenBack, indeterminate    atomic.Uint64
	regrouped                            atomic.Uint64  // quota groups settled again (regroup)
	faultLog                             rate.Sometimes // late and indeterminate outcomes
	closeOnce                            sync.Once

	// releases of cluster reservations run after Apply returns
	releaseCtx   context.Context
	stopReleases context.CancelFunc
	releasing    sync.WaitGroup
	watching     sync.WaitGroup // watchFreed, stopped with the releases
}

var _ engine.Store = (*Store)(nil)

// New connects lazily: it returns an error only for bad options, not for an
// unreachable Redis (Warm connects, Ping says whether Redis answers, for
// readiness).
func New(opts Options) (*Store, error) {
	if opts.Prefix == "" {
		opts.Prefix = "rls:"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Millisecond
	}
	if opts.DenyCacheSize <= 0 {
		opts.DenyCacheSize = 100_000
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 128
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if opts.PerScript <= 0 {
		opts.PerScript = 32
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redis prefix %q: braces would break the cluster hash tag", opts.Prefix)
	}
	url := opts.URL
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	ro, err := redis.ParseURL(url)
	if err != nil {
		// The parser's error quotes the URL: not its password.
		return nil, fmt.Errorf("redis URL: %s", strings.ReplaceAll(err.Error(), url, redactedURL(url)))
	}
	// No retries: go-redis retries a pipeline after a read error or
	// timeout, and a script that Redis did run would then run twice
	// (counted twice). Stale connections after a Redis restart are caught by
	// the pool's health check when taken, not by retries
	// (TestRestartedRedis). The connections' own timeouts come after the
	// pipelines' drain bound, which is in each pipeline's context.
	if opts.minPipelineBound <= 0 {
		opts.minPipelineBound = 100 * time.Millisecond
	}
	bound := pipelineBound(opts)
	ro.DialTimeout = max(5*opts.Timeout, 200*time.Millisecond)
	ro.ReadTimeout, ro.WriteTimeout = 2*drainBound(opts), 2*drainBound(opts)
	ro.MaxRetries = -1
	ro.MinRetryBackoff, ro.MaxRetryBackoff = -1, -1
	// One dial per connection attempt: go-redis's default is 5, 100 ms
	// apart, inside the call that needed the connection. A Redis that
	// refuses connections must cost a call next to nothing (see links),
	// and reconnecting is done in the background.
	ro.DialerRetries = 1
	ro.ContextTimeoutEnabled = true
	if opts.PoolSize > 0 {
		ro.PoolSize = opts.PoolSize
	}
	if opts.CAFile != "" || opts.CertFile != "" || opts.KeyFile != "" || opts.TLSSkipHostname {
		if ro.TLSConfig == nil {
			return nil, errors.New("redis TLS files (CA, client certificate) or host name check: the URL is not rediss://")
		}
		cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CA: opts.CAFile, Cert: opts.CertFile, Key: opts.KeyFile, ServerName: ro.TLSConfig.ServerName,
			SkipHostname: opts.TLSSkipHostname})
		if err != nil {
			return nil, fmt.Errorf("redis TLS: %w", err)
		}
		if ro.TLSConfig.InsecureSkipVerify { // the URL's skip_verify: nothing verified
			cfg.InsecureSkipVerify, cfg.VerifyConnection = true, nil
		}
		ro.TLSConfig = cfg
	}
	if opts.TLSSkipHostname {
		opts.Logger.Warn("redis TLS: the certificate chain is verified, not that it names the host (as envoyproxy/ratelimit's REDIS_TLS_SKIP_HOSTNAME_VERIFICATION): anyone with a certificate of that CA can pose as Redis")
	}
	s := &Store{
		opts: opts,
		log:  opts.Logger,
	}
	switch {
	case opts.Sentinel != nil:
		if len(opts.ClusterSeeds) > 0 {
			return nil, errors.New("redis: Sentinel and cluster seeds given; choose one")
		}
		if s.client, s.master, err = newFailoverClient(opts.Sentinel, ro, opts.Logger, s.masterChanged); err != nil {
			return nil, err
		}
	case len(opts.ClusterSeeds) > 0:
		s.cluster = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 opts.ClusterSeeds,
			Username:              ro.Username,
			Password:              ro.Password,
			TLSConfig:             ro.TLSConfig,
			DialTimeout:           ro.DialTimeout,
			ReadTimeout:           ro.ReadTimeout,
			WriteTimeout:          ro.WriteTimeout,
			MaxRetries:            ro.MaxRetries,
			DialerRetries:         ro.DialerRetries,
			MinRetryBackoff:       ro.MinRetryBackoff,
			MaxRetryBackoff:       ro.MaxRetryBackoff,
			ContextTimeoutEnabled: true,
			PoolSize:              ro.PoolSize,
			// -1: one attempt. go-redis's cluster pipeline sends again the
			// commands of a pipeline whose connection failed, up to
			// MaxRedirects times: a script that had run would run again.
			// MOVED and ASK come back as errors; sendSpan and
			// followSlots follow them.
			MaxRedirects: -1,
		})
		s.client = s.cluster
	default:
		s.client = redis.NewClient(ro)
	}
	if opts.PerSecond != nil {
		if s.perSecond, err = newPerSecond(opts); err != nil {
			s.client.Close()
			return nil, err
		}
	}
	perScript := opts.PerScript
	if s.cluster != nil {
		perScript = 1
	}
	if opts.Now == nil {
		s.clock = newRedisClock()
	}
	s.faultLog = rate.Sometimes{Interval: 10 * time.Second}
	// A connection's setup (dial, handshakes, PING, TIME: about five round
	// trips) gets the dial's timeout and a pipeline's bound.
	options := nodeOptions(s.client, *ro)
	if s.master != nil {
		options = s.master.linkOptions(options)
	}
	s.links = newLinks(opts.Workers, ro.DialTimeout+bound, s.clock, opts.Logger, s.cluster, options)
	if s.master != nil {
		s.links.gate = s.master.writable
	}
	s.b = newBatcher(s.links, opts.MaxBatch, perScript, opts.Workers, opts.Timeout, bound, s.clock)
	s.b.late, s.b.unknown, s.b.drain = s.late, s.unknown, drainBound(opts)
	s.releaseCtx, s.stopReleases = context.WithCancel(context.Background())
	if s.master != nil {
		s.master.start(s.releaseCtx, &s.watching)
	}
	if s.clock != nil {
		s.watching.Add(1)
		go s.sampleClocks()
	}
	if opts.DenyCache {
		s.cache = newDenyCache(opts.DenyCacheSize)
		s.watching.Add(1)
		go s.watchFreed()
	}
	return s, nil
}

// Close stops the workers and closes the connections. Idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		// The workers first: they read the replies in flight (for a
		// pipeline's bound at most), and late ones are given back, as are
		// reservations, before releases stop.
		s.b.close()
		s.releasing.Wait()
		s.stopReleases()
		s.watching.Wait()
		s.links.close()
		err = s.client.Close()
		if s.perSecond != nil {
			err = errors.Join(err, s.perSecond.Close())
		}
	})
	return err
}

// Ping checks that Redis answers (in cluster mode, every master; and the
// per-second Redis) and that the pipelines can send to it: every worker's
// connection set up (see links). A node that does not accept connections
// fails it at once.
func (s *Store) Ping(ctx context.Context) error {
	err := eachNode(ctx, s.client, func(ctx context.Context, addr string, node *redis.Client) error {
		if err := s.links.ready(ctx, addr); err != nil {
			return err
		}
		return node.Ping(ctx).Err()
	})
	if err == nil && s.perSecond != nil {
		if err = s.perSecond.Ping(ctx); err != nil {
			err = fmt.Errorf("per-second Redis: %w", err)
		}
	}
	return err
}

// Warm readies the store before its first requests: it sets up every
// connection the pipelines need (one per worker, on every master: dial,
// handshakes, each node's clock) and loads the function library, so that
// the first requests spend none of their deadlines on it. It returns the
// first error (of each Redis, with a per-second one).
func (s *Store) Warm(ctx context.Context) error {
	var perSecond error
	if s.perSecond != nil {
		if err := s.perSecond.Warm(ctx); err != nil {
			perSecond = fmt.Errorf("per-second Redis: %w", err)
		}
	}
	return errors.Join(perSecond, eachNode(ctx, s.client, func(ctx context.Context, addr string, node *redis.Client) error {
		if err := s.links.ready(ctx, addr); err != nil {
			return err
		}
		return node.FunctionLoadReplace(ctx, lib.source).Err()
	}))
}

// eachNode runs fn on every master of a cluster client, or on the one node
// of another client (its address then ""), and returns the first error.
func eachNode(ctx context.Context, client redis.UniversalClient, fn func(ctx context.Context, addr string, node *redis.Client) error) error {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return fn(ctx, node.Options().Addr, node)
		})
	case *redis.Client:
		return fn(ctx, "", c)
	default:
		return fmt.Errorf("redisstore: a %T is neither a cluster's client nor one node's", client)
	}
}

// nodeOptions returns the options of a connection to a node (by its
// address, "" for the one node of a store that is not a cluster), for the
// pipelines' own connections (links): one node's are its client's, dialer
// included (a Sentinel client's finds the master), read here before the
// client is used; a cluster node's are ro, the URL's, with the node's
// address and database 0, as the cluster client makes them.
func nodeOptions(client redis.UniversalClient, ro redis.Options) func(addr string) *redis.Options {
	if c, ok := client.(*redis.Client); ok {
		one := *c.Options()
		one.PushNotificationProcessor = nil // the client's own; a link's client makes its own
		return func(string) *redis.Options {
			o := one
			return &o
		}
	}
	return func(addr string) *redis.Options {
		o := ro
		o.Addr, o.DB = addr, 0
		return &o
	}
}

// DecisionTimeout is how long Redis has to decide a request once it is
// sent (Options.Timeout): past it the request decides nothing.
func (s *Store) DecisionTimeout() time.Duration { return s.opts.Timeout }

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Decisions:  s.decisions.Load(),
		Scripts:    s.b.scripts.Load(),
		RoundTrips: s.b.roundTrips.Load(),
		CacheHits:  s.cacheHits.Load(),
		Releases:   s.releases.Load(),
		Errors:     s.errs.Load(),

		Expired:       s.expired.Load(),
		Resent:        s.b.resent.Load(),
		GivenBack:     s.givenBack.Load(),
		Indeterminate: s.indeterminate.Load(),
	}
	if s.perSecond != nil {
		st = st.add(s.perSecond.Stats())
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

// Apply implements engine.Store.
func (s *Store) Apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if s.perSecond != nil {
		return s.applySplit(ctx, items, results)
	}
	return s.apply(ctx, items, results)
}

// apply decides a request whose counters are all on s's nodes.
func (s *Store) apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	sent := s.now()
	bases := make([]string, len(items))
	for i := range items {
		bases[i] = s.base(&items[i])
	}
	var epoch uint64
	if s.cache != nil {
		var denied bool
		if denied, epoch = s.cache.deny(items, bases, results, sent); denied {
			s.cacheHits.Add(1)
			s.cacheHit(ctx)
			return false, nil
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		// A caller without a deadline of its own: bound the time queued
		// (and, for a node never heard from, waiting for its clock).
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pipelineBound(s.opts)+s.opts.Timeout)
		defer cancel()
	}
	var admitted bool
	var err error
	if s.cluster == nil {
		admitted, err = s.applyNode(ctx, "", modeFinal, items, bases, results, nil)
	} else {
		admitted, err = s.applyCluster(ctx, items, bases, results)
	}
	if err != nil {
		s.errs.Add(1)
		if errors.Is(err, errExpired) {
			s.expired.Add(1)
		}
		return false, err
	}
	s.decisions.Add(1)
	if s.cache != nil {
		s.cache.remember(items, bases, results, admitted, sent, epoch)
	}
	return admitted, nil
}

// Peek implements engine.Store: the decide function judges the request in
// its dry-run mode (modePeek) on every node that holds part of it (the
// masters of a cluster, the per-second Redis), concurrently; the rule over
// all the verdicts says whether Apply would admit it. The denial cache is
// neither read nor fed.
func (s *Store) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pipelineBound(s.opts)+s.opts.Timeout)
		defer cancel()
	}
	_, err := followSlots(ctx, func(bySlot bool) (bool, []*part, error) {
		var parts []*part
		for _, st := range []*Store{s, s.perSecond} {
			if st == nil {
				continue
			}
			var idx []int
			var its []engine.Item
			var bases []string
			for i := range items {
				if (st == s.perSecond) == (s.perSecond != nil && perSecondLimit(items[i].Rule)) {
					idx, its, bases = append(idx, i), append(its, items[i]), append(bases, st.base(&items[i]))
				}
			}
			p, err := st.split(ctx, idx, its, bases, bySlot)
			if err != nil {
				return false, nil, err
			}
			parts = append(parts, p...)
		}
		var wg sync.WaitGroup
		for _, p := range parts {
			wg.Go(func() {
				_, p.err = p.store.applyNode(ctx, p.addr, modePeek, p.items, p.bases, p.results, nil)
			})
		}
		wg.Wait()
		return false, parts, gather(parts, results)
	})
	if err != nil {
		return false, err
	}
	admitted, _ := engine.Admit(items, results)
	return admitted, nil
}

// applyNode runs the decide function over items (all on node, "" for a
// single node) in mode and writes their results; out, when not nil, gets
// the whole reply (in modeReserve: the undo log and the view).
func (s *Store) applyNode(ctx context.Context, node, mode string, items []engine.Item, bases []string, results []engine.Result, out *reply) (bool, error) {
	return s.send(ctx, node, newRequest(mode, s.nowArg(), s.now(), items, bases), results, out)
}

// send runs the decide function on req (all on node) and writes its
// results; out, when not nil, gets the whole reply. A call that a recorded
// span led to makes a SpanRedis span of its trip (tracing.go).
func (s *Store) send(ctx context.Context, node string, req *request, results []engine.Result, out *reply) (bool, error) {
	ctx, span := spans.Child(ctx, s.opts.Tracer, SpanRedis, trace.SpanKindClient)
	if span.Recording() {
		span.Set(AttrDBSystem.String("redis"), AttrDBOperation.String("FCALL"), AttrMode.String(modeNames[req.mode]), AttrItems.Int(len(req.items)))
		if node != "" {
			span.Set(AttrServerAddress.String(node))
		}
	}
	admitted, err := s.sendSpan(ctx, node, req, results, out, span.Trace())
	span.End(err)
	return admitted, err
}

// sendSpan is send, its trip recorded in span (nil: none). In a cluster
// it follows the redirections of a slot that moves (see cluster.go): a
// request of one slot is sent to the node that ASK names, with ASKING, and
// again after TRYAGAIN; a request of several slots told ASK, and any told
// MOVED, fails with a redirectError, for the caller to split anew. Each
// such error reply means that nothing ran: nothing is sent again that may
// have run.
func (s *Store) sendSpan(ctx context.Context, node string, req *request, results []engine.Result, out *reply, span trace.Span) (bool, error) {
	keys, oneSlot := req.route(s.cluster != nil)
	to, asking, wait := node, false, tryAgainPause
	for tries := 1; ; tries++ {
		if err := s.links.up(ctx, to); err != nil {
			return false, err // nothing sent
		}
		rep, err := s.b.do(ctx, to, keys, asking, req, span)
		if err == nil {
			if out != nil {
				*out = rep
			}
			return rep.results(req, results)
		}
		if s.master != nil && redis.IsReadOnlyError(err) {
			// A replica answered (nothing ran): the master followed is
			// stale; the links are set up again, to the one the
			// sentinels name.
			s.master.stale()
			s.links.reconnect("")
		}
		r, addr := redirected(err)
		if r == notRedirected || s.cluster == nil {
			return false, err
		}
		if tries == maxRedirects || ctx.Err() != nil {
			// Not split anew either: a slot whose keys stay split between
			// two masters (a first hit of a sliding log in a slot that
			// migrates) answers TRYAGAIN until the migration ends.
			return false, fmt.Errorf("%w (%d redirections followed, nothing decided)", err, tries)
		}
		switch {
		case r == redirectAsk && oneSlot:
			to, asking = addr, true
		case r == redirectAsk:
			return false, &redirectError{err} // split by slot, each part then asks
		case r == redirectTryAgain:
			// Back to the slot's master: the move may be over by then.
			pause(ctx, wait)
			to, asking, wait = node, false, 2*wait
		default:
			s.reloadSlots(ctx)
			return false, &redirectError{err}
		}
	}
}

// late handles the reply of a request whose caller stopped waiting (its
// own deadline, or the store's wait): what it consumed (an admission, or a
// denial's hits that count when denied) is given back with its undo log;
// without one (decided well before its deadline, so the reply took longer
// than a whole timeout on its way back) it is indeterminate.
func (s *Store) late(c *call, r reply) {
	switch r.verdict {
	case verdictExpired:
		s.expired.Add(1)
		return
	case verdictAdmitted:
	default:
		if !c.req.chargesDenied() {
			return // denied: nothing consumed
		}
	}
	undo, bases := r.undo, c.req.bases()
	switch {
	case undo == nil:
		s.unknown(c.node, errors.New("a reply came after its caller stopped waiting, decided too early to carry its undo log"))
		return
	case len(undo) == 0:
		return // nothing written
	}
	s.releasing.Add(1)
	go func() {
		defer s.releasing.Done()
		if err := s.release(c.keys[0], undo, bases); err != nil {
			s.unknown(c.node, fmt.Errorf("giving back a late decision: %w", err))
			return
		}
		s.givenBack.Add(1)
	}()
}

// unknown counts a request whose consumption, if any, could not be told
// or given back, and logs it at a bounded rate.
func (s *Store) unknown(node string, err error) {
	n := s.indeterminate.Add(1)
	s.faultLog.Do(func() {
		s.log.Warn("redis: a request may have consumed without rls answering it (counted in rls_redis_indeterminate_total)",
			"node", node, "error", err, "indeterminate_so_far", n)
	})
}

// sampleClocks reads each node's TIME every half clock period until the
// store closes, so that the bounds of their leads stay fresh while few
// requests come (every reply is a reading too).
func (s *Store) sampleClocks() {
	defer s.watching.Done()
	tick := time.NewTicker(clockPeriod / 2)
	defer tick.Stop()
	for {
		select {
		case <-s.releaseCtx.Done():
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(s.releaseCtx, clockPeriod)
		eachNode(ctx, s.client, func(ctx context.Context, addr string, node *redis.Client) error {
			if s.links.downErr(addr) == nil { // a node down is being reconnected: its clock is read then
				s.readNodeClock(ctx, addr, node)
			}
			return nil // the other nodes still
		})
		cancel()
	}
}

func (s *Store) readNodeClock(ctx context.Context, addr string, c redis.Cmdable) error {
	sent := time.Now()
	t, err := c.Time(ctx).Result()
	if err != nil {
		return err
	}
	s.clock.sample(addr, t.UnixMicro(), sent, time.Now())
	return nil
}

// redactedURL is rawURL with the password of its user information, if any,
// replaced by xxxxx: for messages about a URL that may not parse.
func redactedURL(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return rawURL
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return rawURL
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
