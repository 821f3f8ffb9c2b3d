package redisconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/tlsfiles"
)

// Options configure a Conn.
type Options struct {
	// URL is a redis:// or rediss:// (TLS) URL, with user and password in
	// it; default redis://127.0.0.1:6379/0. In cluster mode its
	// credentials and TLS settings apply to every node and its host is
	// ignored.
	URL string
	// ClusterSeeds, when not empty, are host:port seeds of a Redis Cluster.
	ClusterSeeds []string
	// Sentinel, when not nil, names a master that Redis Sentinel watches:
	// the Conn asks the sentinels where it is and follows failovers. The
	// URL then gives the master's credentials, database and TLS; its host
	// is ignored. Not with ClusterSeeds.
	Sentinel *Sentinel
	// CAFile is a PEM file of the CAs that sign the servers' certificates,
	// for rediss:// with a private CA; empty means the system's roots.
	CAFile string
	// CertFile and KeyFile, when set, are PEM files of a client certificate
	// presented to Redis (mutual TLS: Redis's tls-auth-clients), read again
	// at every handshake so that a rotated certificate is used from the
	// next connection on.
	CertFile, KeyFile string
	// TLSSkipHostname verifies Redis's certificate chain but not that it
	// names the host reached (tlsfiles.ClientFiles.SkipHostname); New logs
	// a warning.
	TLSSkipHostname bool
	// PoolSize is the number of connections per node for all but Do's
	// calls (Call, Ping, reading clocks, loading the library, the
	// caller's own commands on Client); 0 means go-redis's default (10 per
	// CPU). Do's pipelines have one connection per worker per node of
	// their own (links).
	PoolSize int
	// Timeout is how long Redis has to run a request once it is sent
	// (default 10ms): its deadline (see batcher). Time queued in the
	// process before sending does not count; a caller's context deadline
	// bounds everything.
	Timeout time.Duration
	// MaxBatch bounds the requests sent in one round trip (default 128).
	MaxBatch int
	// PerScript bounds the requests that one call of Function carries on
	// a single node (default 32; 1 sends every request in a call of its
	// own). In a cluster every request is a call of its own.
	PerScript int
	// Workers is the most pipelines in flight at once (default 4). On a
	// single node the workers gather (see batcher): a second pipeline
	// flies only when a batch is full or the first is slow. In a cluster
	// fewer workers put more requests in each round trip.
	Workers int
	// Library is the source of the Redis Functions library (FUNCTION
	// LOAD) that defines Function and the functions given to Call: loaded
	// on every node by Warm, and again by a call that finds a node without
	// it (a restarted Redis, a new cluster node).
	Library string
	// Function is the library's function that Do calls: with the number of
	// requests it carries, then each request's arguments (Request), it
	// answers an array of one reply per request, in order.
	Function string
	// NoDeadlines sends requests without deadlines and reads no node's
	// clock: for a Function that runs on a test clock of its caller's.
	NoDeadlines bool
	// Logger; nil discards.
	Logger *slog.Logger
	// OnLate, when not nil, is told of every reply that came after its
	// caller stopped waiting (in the goroutine that read it: it must not
	// block); what the request did is the caller's to undo.
	OnLate func(Late)
	// OnIndeterminate, when not nil, is told of every request that was
	// sent and whose reply never came (a broken connection, or one silent
	// past the drain bound): it may have run, unheard.
	OnIndeterminate func(node string, err error)
	// OnMasterChange, when not nil, is told that Sentinel names another
	// master than the one followed until then (a failover): what held for
	// the former does not for the new one. The Conn has set its
	// connections up again and forgotten the former's clock already.
	OnMasterChange func(from, to string)
	// MinPipelineBound, for tests on a starved machine: the least time a
	// pipeline's replies are waited for (default 100 ms; see
	// pipelineBound).
	MinPipelineBound time.Duration
}

// withDefaults returns o with its defaults.
func (o Options) withDefaults() Options {
	if o.URL == "" {
		o.URL = "redis://127.0.0.1:6379/0"
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Millisecond
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.PerScript <= 0 {
		o.PerScript = 32
	}
	if o.MinPipelineBound <= 0 {
		o.MinPipelineBound = 100 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OnLate == nil {
		o.OnLate = func(Late) {}
	}
	if o.OnIndeterminate == nil {
		o.OnIndeterminate = func(string, error) {}
	}
	return o
}

// Conn is rls's connection to one Redis: a single node, the master that
// Sentinel names, or a cluster's masters. It is safe for concurrent use;
// Close stops its goroutines and closes its connections.
type Conn struct {
	opts    Options
	client  redis.UniversalClient
	cluster *redis.ClusterClient // nil for a single node
	master  *masterWatch         // with Sentinel: which node the client reaches
	links   *links
	b       *batcher
	clock   *redisClock // nil with NoDeadlines
	log     *slog.Logger

	ctx       context.Context // ends at Close: stops the Sentinel watch and the clock sampler
	stop      context.CancelFunc
	watching  sync.WaitGroup
	drainOnce sync.Once
	closeOnce sync.Once
}

// Stats are a Conn's counters since it started.
type Stats struct {
	Scripts    uint64 // calls of Function sent
	RoundTrips uint64 // pipelines sent
	// Resent counts sends of requests that Redis had refused as past their
	// deadline, sent again while their callers still waited.
	Resent uint64
}

// New connects lazily: it returns an error only for bad options, not for an
// unreachable Redis (Warm connects, Ping says whether Redis answers).
func New(opts Options) (*Conn, error) {
	opts = opts.withDefaults()
	ro, err := clientOptions(opts)
	if err != nil {
		return nil, err
	}
	c := &Conn{opts: opts, log: opts.Logger}
	if err := c.newClient(ro); err != nil {
		return nil, err
	}
	perScript := opts.PerScript
	if c.cluster != nil {
		perScript = 1
	}
	if !opts.NoDeadlines {
		c.clock = newRedisClock()
	}
	bound := pipelineBound(opts)
	// A connection's setup (dial, handshakes, PING, TIME: about five round
	// trips) gets the dial's timeout and a pipeline's bound.
	c.links = newLinks(opts.Workers, ro.DialTimeout+bound, c.clock, opts.Logger, c.cluster, c.linkOptions(ro))
	if c.master != nil {
		c.links.gate = c.master.writable
	}
	c.b = newBatcher(c.links, opts, perScript, bound, c.clock, c.cluster == nil)
	c.ctx, c.stop = context.WithCancel(context.Background())
	if c.master != nil {
		c.master.start(c.ctx, &c.watching)
	}
	if c.clock != nil {
		c.watching.Go(c.sampleClocks)
	}
	return c, nil
}

// newClient sets c's client up with ro: of the master that Sentinel names,
// of a cluster, or of one node.
func (c *Conn) newClient(ro *redis.Options) error {
	switch o := c.opts; {
	case o.Sentinel != nil:
		if len(o.ClusterSeeds) > 0 {
			return errors.New("redis: Sentinel and cluster seeds given; choose one")
		}
		var err error
		c.client, c.master, err = newFailoverClient(o.Sentinel, ro, o.Logger, c.masterChanged)
		return err
	case len(o.ClusterSeeds) > 0:
		c.cluster = newClusterClient(o.ClusterSeeds, ro)
		c.client = c.cluster
	default:
		c.client = redis.NewClient(ro)
	}
	return nil
}

// linkOptions returns the options of the pipelines' connection to a node
// (nodeOptions), dialed through the Sentinel watch with Sentinel.
func (c *Conn) linkOptions(ro *redis.Options) func(addr string) *redis.Options {
	options := nodeOptions(c.client, *ro)
	if c.master != nil {
		options = c.master.linkOptions(options)
	}
	return options
}

// clientOptions returns the go-redis options of opts's URL, timeouts and
// TLS files.
func clientOptions(opts Options) (*redis.Options, error) {
	url := opts.URL
	ro, err := redis.ParseURL(url)
	if err != nil {
		// The parser's error quotes the URL: not its password.
		return nil, fmt.Errorf("redis URL: %s", strings.ReplaceAll(err.Error(), url, redactedURL(url)))
	}
	// No retries: go-redis retries a pipeline after a read error or
	// timeout, and a function that Redis did run would then run twice.
	// Stale connections after a Redis restart are caught by the pool's
	// health check when taken, not by retries (TestRestartedRedis). The
	// connections' own timeouts come after the pipelines' drain bound,
	// which is in each pipeline's context.
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
	return ro, nil
}

// newClusterClient returns a client of the cluster that seeds belong to,
// with ro's credentials, TLS, timeouts and pool.
func newClusterClient(seeds []string, ro *redis.Options) *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 seeds,
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
		// MaxRedirects times: a function that had run would run again.
		// MOVED and ASK come back as errors; Do and Call follow them.
		MaxRedirects: -1,
	})
}

// Request is one request of the caller's function (Options.Function) as Do
// carries it: a call of the function carries one or more, each with its
// arguments, and answers one reply per request. Do stamps it with its
// deadline (SetDeadline) before each send, and reads its reply's head.
type Request interface {
	// ArgCount is the number of arguments that AppendArgs appends.
	ArgCount() int
	// AppendArgs appends the request's arguments to args.
	AppendArgs(args []any) []any
	// SetDeadline stamps the request with the instant of its node's clock
	// (µs since the epoch) past which the function must not run it, and
	// the one past which a run must carry what undoes it (its reply may
	// come after its caller stopped waiting: Options.OnLate). Not called
	// with Options.NoDeadlines, nor before a node's clock is known.
	SetDeadline(deadline, undoAfter int64)
	// Head reads the request's reply (its element of the function's
	// reply): the node's instant at which the function ran (µs since the
	// epoch), and whether it refused the request as past its deadline,
	// doing nothing.
	Head(reply any) (now int64, expired bool, err error)
}

// Late is a reply that came after its caller stopped waiting
// (Options.OnLate): what the request did is the caller's to undo.
type Late struct {
	Node    string   // the node that ran it ("" on a single node)
	Keys    []string // the keys of its call
	Request Request
	Reply   any // its element of the function's reply
}

// Do runs req on node (NodeOf; "" on a single node) in a call of
// Options.Function with keys, which route the call in a cluster (oneSlot:
// they are every key that req touches, all in one slot), and returns req's
// reply, its element of the function's reply. A reply that Head reads as
// expired is one that Redis refused as past its deadline at every send
// that its caller's wait allowed. onSent, when not nil, is told when req's
// pipeline leaves, and how many requests it carries to that node.
//
// In a cluster, Do follows the redirections of a slot that moves (see
// cluster.go): a call of one slot is sent to the node that ASK names, with
// ASKING, and again after TRYAGAIN; a call of several slots told ASK, and
// any told MOVED, fails with an error for which IsRedirect holds, for the
// caller to split its request anew. With Sentinel, a node that answers as
// a replica has the master asked of the sentinels again.
//
// On error nothing ran, but when the call was sent and its reply did not
// come by its deadline and grace, or ctx ended first: it may have run, and
// its reply, if it comes, goes to OnLate; if it never comes, the call is
// told to OnIndeterminate. A node that cannot be connected fails the call
// at once, with nothing sent.
func (c *Conn) Do(ctx context.Context, node string, keys []string, oneSlot bool, req Request, onSent func(at time.Time, pipeline int)) (any, error) {
	to, asking, wait := node, false, tryAgainPause
	for tries := 1; ; tries++ {
		if err := c.links.up(ctx, to); err != nil {
			return nil, err // nothing sent
		}
		rep, err := c.b.do(ctx, to, keys, asking, req, onSent)
		if err == nil {
			return rep, nil
		}
		if c.master != nil && redis.IsReadOnlyError(err) {
			// A replica answered (nothing ran): the master followed is
			// stale; the links are set up again, to the one the
			// sentinels name.
			c.master.stale()
			c.links.reconnect("")
		}
		r, addr := redirected(err)
		if r == notRedirected || c.cluster == nil {
			return nil, err
		}
		if tries == MaxRedirects || ctx.Err() != nil {
			// Not split anew either: a slot whose keys stay split between
			// two masters (a first hit of a sliding log in a slot that
			// migrates) answers TRYAGAIN until the migration ends.
			return nil, fmt.Errorf("%w (%d redirections followed, nothing decided)", err, tries)
		}
		switch {
		case r == redirectAsk && oneSlot:
			to, asking = addr, true
		case r == redirectAsk:
			return nil, &redirectError{err} // split by slot, each part then asks
		case r == redirectTryAgain:
			// Back to the slot's master: the move may be over by then.
			pause(ctx, wait)
			to, asking, wait = node, false, 2*wait
		default:
			c.reloadSlots(ctx)
			return nil, &redirectError{err}
		}
	}
}

// Drain stops taking requests and waits for the pipelines in flight: their
// replies are read (for a pipeline's drain bound at most), late ones told
// to OnLate. Connections stay open, for what the caller does with those
// (Call). Idempotent; Close drains first.
func (c *Conn) Drain() {
	c.drainOnce.Do(c.b.close)
}

// Close drains (Drain), stops the goroutines and closes the connections.
// Idempotent.
func (c *Conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.Drain()
		c.stop()
		c.watching.Wait()
		c.links.close()
		err = c.client.Close()
	})
	return err
}

// Ping checks that Redis answers (in cluster mode, every master) and that
// the pipelines can send to it: every worker's connection set up (see
// links). A node that does not accept connections fails it at once.
func (c *Conn) Ping(ctx context.Context) error {
	return eachNode(ctx, c.client, func(ctx context.Context, addr string, node *redis.Client) error {
		if err := c.links.ready(ctx, addr); err != nil {
			return err
		}
		return node.Ping(ctx).Err()
	})
}

// Warm readies the Conn before its first requests: it sets up every
// connection the pipelines need (one per worker, on every master: dial,
// handshakes, each node's clock) and loads the library, so that the first
// requests spend none of their deadlines on it. It returns the first
// error.
func (c *Conn) Warm(ctx context.Context) error {
	return eachNode(ctx, c.client, func(ctx context.Context, addr string, node *redis.Client) error {
		if err := c.links.ready(ctx, addr); err != nil {
			return err
		}
		return node.FunctionLoadReplace(ctx, c.opts.Library).Err()
	})
}

// Client returns the client of the caller's own commands (not Do's
// requests: Do has connections of its own), for commands whose outcome
// does not need Do's care (a reset, a subscription). It is the Conn's:
// closed by Close.
func (c *Conn) Client() redis.UniversalClient { return c.client }

// Cluster reports whether the Conn is on a Redis Cluster.
func (c *Conn) Cluster() bool { return c.cluster != nil }

// NodeOf returns the node that holds key: the address of its slot's
// master in a cluster, "" otherwise.
func (c *Conn) NodeOf(ctx context.Context, key string) (string, error) {
	if c.cluster == nil {
		return "", nil
	}
	node, err := c.cluster.MasterForKey(ctx, key)
	if err != nil {
		return "", fmt.Errorf("redis cluster: slot of %q: %w", key, err)
	}
	return node.Options().Addr, nil
}

// MaxWait is how long a request whose caller has no deadline of its own
// may take in all: queued, sent, and its reply waited for.
func (c *Conn) MaxWait() time.Duration { return pipelineBound(c.opts) + c.opts.Timeout }

// Stats returns the Conn's counters.
func (c *Conn) Stats() Stats {
	return Stats{Scripts: c.b.scripts.Load(), RoundTrips: c.b.roundTrips.Load(), Resent: c.b.resent.Load()}
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
		return fmt.Errorf("redisconn: a %T is neither a cluster's client nor one node's", client)
	}
}

// nodeOptions returns the options of a connection to a node (by its
// address, "" for the one node of a Conn that is not a cluster), for the
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

// sampleClocks reads each node's TIME every half clock period until the
// Conn closes, so that the bounds of their leads stay fresh while few
// requests come (every reply is a reading too).
func (c *Conn) sampleClocks() {
	tick := time.NewTicker(clockPeriod / 2)
	defer tick.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, clockPeriod)
		eachNode(ctx, c.client, func(ctx context.Context, addr string, node *redis.Client) error {
			if c.links.downErr(addr) != nil {
				return nil // being reconnected: its clock is read then; the other nodes still
			}
			sent := time.Now()
			if t, err := node.Time(ctx).Result(); err == nil {
				c.clock.sample(addr, t.UnixMicro(), sent, time.Now())
			}
			return nil
		})
		cancel()
	}
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
