package redisconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// links are the connections that the pipeline workers send decisions on:
// for every Redis node that requests go to, one connection per worker,
// which that worker owns. A connection is set up (dialed, its TLS handshake
// and the client's handshake made, a PING answered, the node's clock read)
// before a worker stamps deadlines on the calls it sends there, never
// while a call's deadline runs: not at start (Warm and Ping set every
// worker's connection up before the Conn says it is ready), not when a
// connection broke, not when a node is new. A link's client dials only
// while it is being set up; at any other moment its dialer refuses, so no
// pipeline dials behind a deadline.
//
// A node whose connection cannot be set up (refused, unreachable, a failed
// handshake) is down, and a prober owned by links sets its connections up
// again in the background: at growing intervals (probeFirst to probeMax)
// while nobody calls, and at once (at most one attempt per probeGap) when
// a call asks. A call to a node that is down asks for an attempt that
// starts after it asked, waits for it at most downWait, and fails unless
// it brought the node back, with nothing sent: a node that refuses
// connections answers the attempt in about a millisecond, and a node that
// came back serves the first call after it (calls that come together
// share one attempt). In a cluster the prober also reloads the slot map,
// and drops a node that is no longer a master.
//
// Safe for concurrent use; close stops the probers and closes every
// connection.
type links struct {
	workers int
	setup   time.Duration // bound on setting one connection up
	clock   *redisClock   // nil: no clock to read (the scripts run on a test clock)
	log     *slog.Logger
	cluster *redis.ClusterClient // nil for a single node
	// options returns the options of a connection to the node at addr
	// (credentials, TLS, timeouts); a new value at each call.
	options func(addr string) *redis.Options
	// gate, when not nil, says whether the node takes writes now: its
	// error fails a call at once, with nothing sent (with Sentinel: a
	// failover under way, see masterWatch).
	gate func() error

	ctx  context.Context // ends at close: stops the probers
	stop context.CancelFunc

	// nodes are the links by node address ("" for a single node): read by
	// every call without a lock or an allocation, replaced (under mu) when
	// a node is first seen or dropped.
	nodes  atomic.Pointer[map[string]*nodeLinks]
	mu     sync.Mutex
	closed bool // guarded by mu

	probers sync.WaitGroup
	setups  atomic.Uint64 // connections set up
}

// nodeLinks are the workers' connections to one node.
type nodeLinks struct {
	addr  string  // the key of the node ("" for a single node)
	name  string  // its address, for errors and logs
	conns []*link // conns[i] is worker i's
	// down, when set, is why no connection to the node can be set up; a
	// prober is then running.
	down    atomic.Pointer[error]
	retired atomic.Bool // no longer a master of the cluster: not used again
	// kick asks the node's prober for an attempt now (1-buffered).
	kick chan struct{}
	// failed is when the last attempt to connect failed (UnixNano).
	failed atomic.Int64

	mu sync.Mutex
	// next is closed when the prober's next attempt (one not started yet)
	// ends; guarded by mu.
	next chan struct{}
}

// link is one worker's connection to one node: a go-redis client of one
// connection, which dials only while armed (during setup).
type link struct {
	node *nodeLinks
	// held is a lock that can wait for a context: held by the worker
	// sending on the link, or by whoever sets it up.
	held chan struct{}
	// client is nil until the link is set up; guarded by held.
	client *redis.Client
	// ready: set up and not known to be broken since. Read without held.
	ready atomic.Bool
	// flying is the flight of its pipelines (lazily made); guarded by
	// held.
	flying *flight

	mu     sync.Mutex // guards the fields below, written by the client's dialer
	armed  bool
	conn   net.Conn        // the connection the client dialed
	socket syscall.RawConn // conn's socket, nil when it cannot be looked at
}

// Probes of a down node: the first after probeFirst, then at intervals
// doubling to probeMax, or sooner when a call asks, but never within
// probeGap of the last failure. A call to a node that is down waits
// downWait at most for the attempt it asked for.
const (
	probeFirst = 50 * time.Millisecond
	probeMax   = time.Second
	probeGap   = time.Millisecond
	downWait   = 30 * time.Millisecond
)

// errNoDial is what a link's dialer answers outside setup: the request
// that needed a new connection was not sent.
var errNoDial = errors.New("redis: no connection set up for this pipeline (nothing sent)")

func newLinks(workers int, setup time.Duration, clock *redisClock, log *slog.Logger, cluster *redis.ClusterClient, options func(addr string) *redis.Options) *links {
	ctx, stop := context.WithCancel(context.Background())
	ls := &links{
		workers: workers, setup: setup, clock: clock, log: log, cluster: cluster, options: options,
		ctx: ctx, stop: stop,
	}
	ls.nodes.Store(&map[string]*nodeLinks{})
	return ls
}

// node returns the links to the node at addr, creating them (not
// connected) the first time.
func (ls *links) node(addr string) *nodeLinks {
	if n := ls.known(addr); n != nil {
		return n
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	old := *ls.nodes.Load()
	if n := old[addr]; n != nil {
		return n
	}
	n := &nodeLinks{addr: addr, name: ls.options(addr).Addr, kick: make(chan struct{}, 1), next: make(chan struct{})}
	for range ls.workers {
		n.conns = append(n.conns, &link{node: n, held: make(chan struct{}, 1)})
	}
	m := maps.Clone(old)
	m[addr] = n
	ls.nodes.Store(&m)
	return n
}

// known returns the links to the node at addr, or nil when none were made.
func (ls *links) known(addr string) *nodeLinks {
	return (*ls.nodes.Load())[addr]
}

// downErr returns the error that took the node at addr down, or nil.
func (ls *links) downErr(addr string) error {
	n := ls.known(addr)
	if n == nil {
		return nil
	}
	return n.downErr()
}

// up returns nil when the node at addr is up, or comes back by the
// attempt that up asks its prober for (one that starts after up is
// called), within downWait (or ctx); else the error that keeps it down.
func (ls *links) up(ctx context.Context, addr string) error {
	n := ls.known(addr)
	if n == nil {
		return nil
	}
	ended := n.nextAttempt()
	if n.down.Load() == nil {
		return nil
	}
	select {
	case n.kick <- struct{}{}:
	default: // asked already
	}
	wait := time.NewTimer(downWait)
	defer wait.Stop()
	select {
	case <-ended:
	case <-wait.C:
	case <-ctx.Done():
	}
	return n.downErr()
}

// nextAttempt returns a channel closed when the prober's next attempt,
// one that has not started yet, ends: an attempt in flight may have
// dialed before the node came back.
func (n *nodeLinks) nextAttempt() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.next
}

// startAttempt returns the channel to close when the attempt starting now
// ends.
func (n *nodeLinks) startAttempt() chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	this := n.next
	n.next = make(chan struct{})
	return this
}

func (n *nodeLinks) downErr() error {
	if p := n.down.Load(); p != nil {
		return *p
	}
	return nil
}

func (l *link) lock(ctx context.Context) error {
	select {
	case l.held <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *link) unlock() { <-l.held }

// take returns worker's link to the node at addr, held and set up, for a
// pipeline: set up now when it is not (before the caller stamps any
// deadline). It fails at once when the node is down, and when the setup
// fails (the node is then down).
func (ls *links) take(addr string, worker int) (*link, error) {
	n := ls.node(addr)
	if err := n.downErr(); err != nil {
		return nil, err
	}
	if err := ls.writable(); err != nil {
		return nil, err
	}
	l := n.conns[worker]
	l.lock(context.Background())
	if n.retired.Load() {
		l.unlock()
		return nil, fmt.Errorf("redis: %s is no longer a master of the cluster (nothing sent)", n.name)
	}
	if err := ls.ensure(ls.ctx, l); err != nil {
		l.unlock()
		return nil, err
	}
	return l, nil
}

// writable returns the gate's error, or nil.
func (ls *links) writable() error {
	if ls.gate == nil {
		return nil
	}
	return ls.gate()
}

// give releases a link that take returned.
func (ls *links) give(l *link) { l.unlock() }

// ensure sets l up unless it is set up and its connection alive; when
// that fails, l's node is down. Requires l held.
func (ls *links) ensure(ctx context.Context, l *link) error {
	if l.ready.Load() && l.alive() {
		return nil
	}
	if err := ls.connect(ctx, l); err != nil {
		return ls.markDown(l.node, err)
	}
	return nil
}

// broken records that l's connection failed: it is set up again before
// its next use.
func (l *link) broken() { l.ready.Store(false) }

// handOff gives l's client up to a pipeline that goes on reading its
// replies, and closes it: l is set up again, on a new connection, before
// its next use. Requires l held.
func (l *link) handOff() {
	l.client, l.flying = nil, nil // the pipeline keeps both
	l.ready.Store(false)
	l.mu.Lock()
	l.conn, l.socket = nil, nil
	l.mu.Unlock()
}

// flight returns l's flight, for a pipeline on it. Requires l held.
func (l *link) flight() *flight {
	if l.flying == nil {
		l.flying = newFlight()
	}
	return l.flying
}

// reconnect has every link to the node at addr set up again before its
// next use: another server answers under that name now (the master that
// Sentinel names after a failover), and a connection to the former one
// may still be open (a demoted master stays up as a replica).
func (ls *links) reconnect(addr string) {
	if n := ls.known(addr); n != nil {
		for _, l := range n.conns {
			l.broken()
		}
	}
}

// alive reports whether l's connection is open with nothing unread.
func (l *link) alive() bool {
	l.mu.Lock()
	c, socket := l.conn, l.socket
	l.mu.Unlock()
	return c != nil && socketAlive(socket)
}

// rawSocket returns the socket of l's connection, nil when it has none or
// it cannot be looked at.
func (l *link) rawSocket() syscall.RawConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.socket
}

// connect replaces l's client with a new one and sets it up: dial, the
// handshakes, a PING, and a reading of the node's clock, within ls.setup.
// Requires l held.
func (ls *links) connect(ctx context.Context, l *link) error {
	if ls.ctx.Err() != nil {
		return errClosed // close has closed l's client, or will not see a new one
	}
	l.ready.Store(false)
	if l.client != nil {
		l.client.Close()
		l.client = nil
	}
	n := l.node
	opts := ls.options(n.addr)
	// One connection, dialed here only, kept however long it idles, never
	// retried: see the type's doc.
	opts.PoolSize, opts.MinIdleConns, opts.MaxIdleConns, opts.MaxActiveConns = 1, 0, 1, 1
	opts.PipelinePoolSize = -1 // pipelines on that one connection, not a pool of their own
	opts.ConnMaxIdleTime, opts.ConnMaxLifetime = -1, 0
	opts.MaxRetries, opts.DialerRetries = -1, 1
	// Maintenance notifications (Redis Enterprise) move connections by
	// dialing anew, which a link does only in setup: off, and the round
	// trip of their handshake saved.
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	dial := opts.Dialer
	if dial == nil {
		dial = redis.NewDialer(opts)
	}
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		l.mu.Lock()
		armed := l.armed
		l.mu.Unlock()
		if !armed {
			return nil, errNoDial
		}
		c, err := dial(ctx, network, addr)
		if err == nil {
			socket := socketOf(c)
			l.mu.Lock()
			l.conn, l.socket = c, socket
			l.mu.Unlock()
		}
		return c, err
	}
	ctx, cancel := context.WithTimeout(ctx, ls.setup)
	defer cancel()
	client := redis.NewClient(opts)
	l.setArmed(true)
	err := client.Ping(ctx).Err()
	l.setArmed(false)
	if err == nil && ls.clock != nil {
		// A round trip of its own, on the connection now open, for a
		// close bound of the node's clock.
		sent := time.Now()
		var t time.Time
		if t, err = client.Time(ctx).Result(); err == nil {
			ls.clock.sample(n.addr, t.UnixMicro(), sent, time.Now())
		}
	}
	if err != nil {
		client.Close()
		return fmt.Errorf("redis: connecting to %s: %w", n.name, err)
	}
	l.client = client
	l.ready.Store(true)
	ls.setups.Add(1)
	return nil
}

func (l *link) setArmed(on bool) {
	l.mu.Lock()
	l.armed = on
	if on {
		l.conn, l.socket = nil, nil
	}
	l.mu.Unlock()
}

// markDown records that no connection to n could be set up (err), starts
// its prober unless n is down already, and returns the error that calls to
// n get meanwhile.
func (ls *links) markDown(n *nodeLinks, err error) error {
	err = downError(err)
	n.failed.Store(time.Now().UnixNano())
	if !n.down.CompareAndSwap(nil, &err) {
		return err
	}
	ls.log.Warn("redis: a node does not answer; calls to it fail at once until it does", "node", n.name, "error", err)
	if ls.cluster != nil {
		ls.cluster.ReloadState(ls.ctx) // a failover may have moved its slots
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !ls.closed {
		ls.probers.Add(1)
		go ls.probe(n)
	}
	return err
}

// downError is the error of the calls to a node that is down, whose last
// connection failed with err.
func downError(err error) error {
	return fmt.Errorf("%w (calls to it fail at once, nothing sent, until rls reconnects in the background)", err)
}

// probe sets every connection to n up anew, at growing intervals or when
// a call asks, until an attempt sets them all up (n is up again), n is no
// longer a master of the cluster (n is dropped), or links close.
func (ls *links) probe(n *nodeLinks) {
	defer ls.probers.Done()
	wait := probeFirst
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var checked time.Time // when the cluster last said n is a master
	for {
		select {
		case <-ls.ctx.Done():
			return
		case <-timer.C:
		case <-n.kick:
		}
		if rest := probeGap - time.Since(time.Unix(0, n.failed.Load())); rest > 0 {
			select {
			case <-ls.ctx.Done():
				return
			case <-time.After(rest):
			}
		}
		select {
		case <-n.kick: // this attempt answers it too
		default:
		}
		ended := n.startAttempt()
		ctx, cancel := context.WithTimeout(ls.ctx, ls.setup)
		// The slot map is read again at most once per probeFirst: calls ask
		// for attempts up to once a millisecond.
		if ls.cluster != nil && time.Since(checked) >= probeFirst {
			if ls.notMaster(ctx, n.addr) {
				cancel()
				ls.retire(n)
				close(ended)
				return
			}
			checked = time.Now()
		}
		err := ls.connectAll(ctx, n, true)
		cancel()
		if err == nil {
			n.down.Store(nil)
			close(ended)
			ls.log.Info("redis: a node answers again", "node", n.name)
			return
		}
		err = downError(err)
		n.down.Store(&err)
		n.failed.Store(time.Now().UnixNano())
		close(ended)
		wait = min(2*wait, probeMax)
		timer.Reset(wait)
	}
}

// connectAll sets up every link of n: anew with all, else those not set
// up. The first goes alone (a node that refuses costs one dial), the
// others then together. It returns their errors.
func (ls *links) connectAll(ctx context.Context, n *nodeLinks, all bool) error {
	var todo []*link
	for _, l := range n.conns {
		if all || !l.ready.Load() { // a link set up is checked by its worker before each use
			todo = append(todo, l)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	connect := func(l *link) error {
		if err := l.lock(ctx); err != nil {
			return fmt.Errorf("redis: connecting to %s: %w", n.name, err)
		}
		defer l.unlock()
		if !all && l.ready.Load() {
			return nil // set up meanwhile
		}
		return ls.connect(ctx, l)
	}
	if err := connect(todo[0]); err != nil {
		return err
	}
	errs := make([]error, len(todo))
	var wg sync.WaitGroup
	for i, l := range todo[1:] {
		wg.Go(func() { errs[i] = connect(l) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ready sets up every worker's connection to the node at addr that is not
// set up, for Warm and Ping: it fails when the node is down (and does not
// come back within downWait), and when a setup fails (the node is then
// down).
func (ls *links) ready(ctx context.Context, addr string) error {
	n := ls.node(addr)
	if err := ls.up(ctx, addr); err != nil {
		return err
	}
	if err := ls.writable(); err != nil {
		return err // the node is not down: no connection is made meanwhile
	}
	if err := ls.connectAll(ctx, n, false); err != nil {
		if ctx.Err() != nil || errors.Is(err, errClosed) {
			return err // the caller's wait, not the node
		}
		return ls.markDown(n, err)
	}
	return nil
}

// notMaster reports whether the cluster says that addr is not one of its
// masters, by a fresh slot map when the cluster answers, else the last
// one; false when it cannot tell.
func (ls *links) notMaster(ctx context.Context, addr string) bool {
	var found atomic.Bool
	err := ls.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			found.Store(true)
		}
		return nil
	})
	return err == nil && !found.Load()
}

// retire drops n, a node that left the cluster's masters: its connections
// are closed, the runners of their flights end, and a request routed to
// its address again gets new links.
func (ls *links) retire(n *nodeLinks) {
	ls.mu.Lock()
	if old := *ls.nodes.Load(); old[n.addr] == n {
		m := maps.Clone(old)
		delete(m, n.addr)
		ls.nodes.Store(&m)
	}
	ls.mu.Unlock()
	n.retired.Store(true)
	for _, l := range n.conns {
		l.lock(context.Background())
		if l.client != nil {
			l.client.Close()
			l.client = nil
		}
		if l.flying != nil {
			l.flying.end()
			l.flying = nil
		}
		l.ready.Store(false)
		l.unlock()
	}
	ls.log.Info("redis: a node that did not answer is no longer a master of the cluster; dropped", "node", n.name)
}

// close stops the probers and closes every connection. The workers must
// have stopped.
func (ls *links) close() {
	ls.stop() // from here on connect sets nothing up: every client is in a node below
	ls.mu.Lock()
	ls.closed = true
	nodes := *ls.nodes.Load()
	ls.mu.Unlock()
	ls.probers.Wait()
	for _, n := range nodes {
		for _, l := range n.conns {
			l.lock(context.Background())
			if l.client != nil {
				l.client.Close()
				l.client = nil
			}
			l.unlock()
		}
	}
}
