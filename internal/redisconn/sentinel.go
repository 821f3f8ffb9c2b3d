package redisconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Sentinel names a master that Redis Sentinel watches (Options.Sentinel).
// Its zero value names none, which New refuses.
type Sentinel struct {
	// Master is the master's name in the sentinels' config (sentinel
	// monitor <name> ...).
	Master string
	// Addrs are host:port of sentinels; the others are discovered from
	// them.
	Addrs []string
	// Username and Password authenticate to the sentinels (their
	// requirepass or ACL user), not to the master, whose credentials are
	// the URL's. Empty: none.
	Username, Password string
}

// newFailoverClient returns a client of the master that sen's sentinels
// name, with ro's credentials, database, timeouts, retries and pool, TLS
// for the master and the sentinels alike, each verified under the address
// it is reached at (ro's ServerName, the URL's ignored host, is dropped);
// and the watch that follows that master (masterWatch). The client dials
// the master that the watch follows, refuses a node that does not say it
// is a master, and drops a pooled connection to a former master before
// its next use (masterConn). onChange runs when the watch follows another
// master.
func newFailoverClient(sen *Sentinel, ro *redis.Options, log *slog.Logger, onChange func(from, to string)) (*redis.Client, *masterWatch, error) {
	if sen.Master == "" || len(sen.Addrs) == 0 {
		return nil, nil, fmt.Errorf("redis sentinel: %q and %q: a master name and at least one sentinel host:port are needed", sen.Master, sen.Addrs)
	}
	for _, a := range sen.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, nil, fmt.Errorf("redis sentinel address %q: %w", a, err)
		}
	}
	o := *ro
	if o.TLSConfig != nil {
		o.TLSConfig = o.TLSConfig.Clone()
		o.TLSConfig.ServerName = ""
	}
	w := newMasterWatch(sen, &o, log, onChange)
	o.Addr = sen.Master // a name for logs; the dialer finds the address
	o.Dialer = w.dialPooled
	o.OnConnect = w.onConnect(ro.OnConnect)
	// Maintenance notifications (Redis Enterprise) move connections by
	// dialing the address they name, which is the watch's to choose.
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return redis.NewClient(&o), w, nil
}

// masterWatch follows which node is the master that the sentinels watch,
// for the Conn's connections to it: the Conn's client and the links dial
// the address it holds (dial). It learns it by asking every sentinel
// (SENTINEL MASTER: the answer of the highest config epoch wins) when it
// holds none, and from the events of every sentinel, subscribed to on
// each (the sentinels given and those they know of):
//
//   - +failover-state-send-slaveof-noone: the leader of a failover is about
//     to promote a replica; a write to the old master from then on would be
//     lost when it is made a replica in turn. Writes are held (writable
//     fails, and so does dial: nothing sent) until the failover ends.
//   - +switch-master: the failover ended; the new master is followed at
//     once, and the hold ends.
//   - -failover-abort-*, +failover-end-for-timeout: the hold ends.
//
// While writes are held, the sentinels are asked every holdPoll (a missed
// +switch-master), and the hold ends after failoverHoldMax whatever
// happens. Every new connection checks that its node says it is a master
// (onConnect): a replica, or a master demoted since a sentinel named it,
// is refused, and the sentinels are asked again. Its goroutines run from
// start until the context given there ends. Its zero value is not usable
// (newMasterWatch); safe for concurrent use.
type masterWatch struct {
	name     string
	log      *slog.Logger
	onChange func(from, to string)
	// dialer dials a data node (TLS, the dial timeout); sentinel returns
	// the options of a client of the sentinel at addr.
	dialer   func(ctx context.Context, network, addr string) (net.Conn, error)
	sentinel func(addr string) *redis.Options
	// kick asks the resolver to ask the sentinels now (1-buffered).
	kick chan struct{}

	mu        sync.Mutex
	addr      string                           // the master followed; "" before the first answer; guarded by mu
	held      time.Time                        // when writes were held; zero when they are not; guarded by mu
	moved     context.Context                  // cancelled at the next change; guarded by mu
	move      context.CancelFunc               // cancels moved; guarded by mu
	sentinels map[string]*redis.SentinelClient // by address; guarded by mu
	ctx       context.Context                  // start's (nil before); set under mu, then read only
	wg        *sync.WaitGroup                  // start's; set under mu, then read only
	stopped   bool                             // ctx ended: no goroutine starts; guarded by mu
}

// How the watch follows the sentinels: see masterWatch.
const (
	holdPoll        = 100 * time.Millisecond
	failoverHoldMax = 10 * time.Second
	// sentinelPing: a silent subscription is pinged; with no answer by the
	// next, it is replaced. sentinelRetry: the first pause before
	// subscribing again after a failure, doubling to sentinelMaxRetry.
	sentinelPing     = 5 * time.Second
	sentinelRetry    = 200 * time.Millisecond
	sentinelMaxRetry = 5 * time.Second
)

// The sentinels' events that the watch follows (see masterWatch).
const (
	eventSwitch      = "+switch-master"
	eventPromoting   = "+failover-state-send-slaveof-noone"
	eventEndTimeout  = "+failover-end-for-timeout"
	eventAbortPrefix = "-failover-abort-"
)

// errFailover is the error of a write while a failover is under way.
var errFailover = errors.New("redis: a Sentinel failover is under way; writes held until the new master is known (nothing sent)")

func newMasterWatch(sen *Sentinel, ro *redis.Options, log *slog.Logger, onChange func(from, to string)) *masterWatch {
	w := &masterWatch{name: sen.Master, log: log, onChange: onChange, kick: make(chan struct{}, 1),
		sentinels: map[string]*redis.SentinelClient{}}
	w.moved, w.move = context.WithCancel(context.Background())
	w.dialer = redis.NewDialer(&redis.Options{DialTimeout: ro.DialTimeout, TLSConfig: ro.TLSConfig})
	w.sentinel = func(addr string) *redis.Options {
		return &redis.Options{
			Addr: addr, Username: sen.Username, Password: sen.Password, TLSConfig: ro.TLSConfig,
			DialTimeout: ro.DialTimeout, ReadTimeout: ro.ReadTimeout, WriteTimeout: ro.WriteTimeout,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, PoolSize: 2,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		}
	}
	for _, a := range sen.Addrs {
		w.watchLocked(a)
	}
	return w
}

// start starts the subscriptions and the resolver, counted in wg, until
// ctx ends; the sentinels' clients are closed then (a sentinel learnt of
// later, when it is closed as it is added).
func (w *masterWatch) start(ctx context.Context, wg *sync.WaitGroup) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ctx, w.wg = ctx, wg
	for addr, sc := range w.sentinels {
		w.subscribeLocked(addr, sc)
	}
	wg.Go(w.resolver)
}

// watchLocked adds the sentinel at addr, subscribed to once started.
// Requires w.mu held.
func (w *masterWatch) watchLocked(addr string) {
	if _, ok := w.sentinels[addr]; ok {
		return
	}
	sc := redis.NewSentinelClient(w.sentinel(addr))
	w.sentinels[addr] = sc
	if w.ctx != nil {
		w.subscribeLocked(addr, sc)
	}
}

// subscribeLocked starts the subscription to sc. Requires w.mu held.
func (w *masterWatch) subscribeLocked(addr string, sc *redis.SentinelClient) {
	if w.stopped {
		sc.Close()
		return
	}
	w.wg.Go(func() {
		defer sc.Close()
		w.subscribe(addr, sc)
	})
}

// subscribe follows the events of the sentinel sc until w's context ends,
// subscribing again (after a pause) when the subscription fails.
func (w *masterWatch) subscribe(addr string, sc *redis.SentinelClient) {
	ctx := w.ctx
	wait, warned := sentinelRetry, false
	for ctx.Err() == nil {
		ps := sc.Subscribe(ctx, eventSwitch, eventPromoting, eventEndTimeout)
		stop := context.AfterFunc(ctx, func() { ps.Close() }) // ends a blocked read
		err := ps.PSubscribe(ctx, eventAbortPrefix+"*")
		if err == nil {
			err = w.follow(ctx, ps, &wait, &warned)
		}
		stop()
		ps.Close()
		if ctx.Err() != nil {
			return
		}
		if !warned {
			w.log.Warn("redis: no subscription to a sentinel's events; its failovers are learnt from the others", "sentinel", addr, "error", err)
			warned = true
		}
		pause(ctx, wait)
		wait = min(2*wait, sentinelMaxRetry)
	}
}

// follow reads ps until it fails or stays silent through a ping. A
// confirmed subscription resets the retries and asks the sentinels where
// the master is (events may have been missed meanwhile).
func (w *masterWatch) follow(ctx context.Context, ps *redis.PubSub, wait *time.Duration, warned *bool) error {
	return Receive(ctx, ps, sentinelPing, func(msg any) {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "psubscribe" {
				*wait, *warned = sentinelRetry, false
				w.stale()
			}
		case *redis.Message:
			w.event(m.Channel, m.Payload)
		}
	})
}

// event handles a sentinel's event on channel.
func (w *masterWatch) event(channel, payload string) {
	f := strings.Fields(payload)
	switch {
	case channel == eventSwitch:
		// <name> <old ip> <old port> <new ip> <new port>
		if len(f) == 5 && f[0] == w.name {
			w.switchTo(net.JoinHostPort(f[3], f[4]))
		}
	case channel == eventPromoting:
		// slave <ip:port> <ip> <port> @ <name> <master ip> <master port>
		if len(f) == 8 && f[5] == w.name {
			w.hold()
		}
	case channel == eventEndTimeout || strings.HasPrefix(channel, eventAbortPrefix):
		// master <name> <ip> <port>
		if len(f) >= 2 && f[1] == w.name {
			w.release(channel)
		}
	}
}

// hold holds writes: a failover promotes a replica.
func (w *masterWatch) hold() {
	w.mu.Lock()
	first := w.held.IsZero()
	if first {
		w.held = time.Now()
	}
	from := w.addr
	w.mu.Unlock()
	if first {
		w.log.Warn("redis: a sentinel promotes a replica; writes held until the new master is known", "master", from)
		w.stale()
	}
}

// release ends a hold that did not end with a switch (why: the event).
func (w *masterWatch) release(why string) {
	w.mu.Lock()
	was := !w.held.IsZero()
	w.held = time.Time{}
	w.mu.Unlock()
	if was {
		w.log.Warn("redis: a Sentinel failover ended without a switch; writes go on", "event", why)
		w.stale()
	}
}

// stale asks the resolver to ask the sentinels where the master is.
func (w *masterWatch) stale() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// resolver asks the sentinels where the master is when told to (stale),
// and every holdPoll while writes are held, until w's context ends.
func (w *masterWatch) resolver() {
	ctx := w.ctx
	poll := time.NewTicker(holdPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			// Counted in wg until here: a subscription that a late resolve
			// would start is not started (wg may be waited for already).
			w.mu.Lock()
			w.stopped = true
			w.mu.Unlock()
			return
		case <-w.kick:
		case <-poll.C:
			w.mu.Lock()
			held := w.held
			w.mu.Unlock()
			if held.IsZero() {
				continue
			}
			if time.Since(held) > failoverHoldMax {
				w.release(fmt.Sprintf("no switch within %s", failoverHoldMax))
			}
		}
		rctx, cancel := context.WithTimeout(ctx, holdPoll*5)
		w.resolve(rctx)
		cancel()
	}
}

// resolve asks every sentinel where the master is, concurrently, and
// follows the answer of the highest config epoch; it learns of the
// sentinels that they know of. It returns the master, or an error when no
// sentinel answers.
func (w *masterWatch) resolve(ctx context.Context) (string, error) {
	w.mu.Lock()
	sentinels := maps.Clone(w.sentinels)
	w.mu.Unlock()
	type answer struct {
		addr  string
		epoch int64
		known []string // the other sentinels
		err   error
	}
	answers := make(chan answer, len(sentinels))
	var wg sync.WaitGroup
	for at, sc := range sentinels {
		wg.Go(func() {
			m, err := sc.Master(ctx, w.name).Result()
			if err != nil {
				answers <- answer{err: fmt.Errorf("sentinel %s: %w", at, err)}
				return
			}
			epoch, _ := strconv.ParseInt(m["config-epoch"], 10, 64)
			a := answer{addr: net.JoinHostPort(m["ip"], m["port"]), epoch: epoch}
			if others, err := sc.Sentinels(ctx, w.name).Result(); err == nil {
				for _, o := range others {
					if o["ip"] != "" && o["port"] != "" {
						a.known = append(a.known, net.JoinHostPort(o["ip"], o["port"]))
					}
				}
			}
			answers <- a
		})
	}
	wg.Wait()
	close(answers)
	best := answer{epoch: -1}
	var errs []error
	var known []string
	for a := range answers {
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		known = append(known, a.known...)
		if a.epoch > best.epoch {
			best = a
		}
	}
	if best.addr == "" {
		return "", fmt.Errorf("redis sentinel: no sentinel names master %q: %w", w.name, errors.Join(errs...))
	}
	w.mu.Lock()
	for _, k := range known {
		w.watchLocked(k)
	}
	held, current := !w.held.IsZero(), w.addr
	w.mu.Unlock()
	// While writes are held, only a switch ends the hold: the sentinels
	// name the old master until the promotion is done.
	if !held || best.addr != current {
		w.switchTo(best.addr)
	}
	return best.addr, nil
}

// switchTo follows the master at addr, and ends a hold.
func (w *masterWatch) switchTo(addr string) {
	w.mu.Lock()
	from := w.addr
	w.held = time.Time{}
	changed := from != addr
	if changed {
		w.addr = addr
		w.move()
		w.moved, w.move = context.WithCancel(context.Background())
	}
	w.mu.Unlock()
	if changed && from != "" && w.onChange != nil {
		w.onChange(from, addr)
	}
}

// writable returns errFailover while writes are held, else nil.
func (w *masterWatch) writable() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.held.IsZero() {
		return errFailover
	}
	return nil
}

// dial connects to the master: the one followed, or the one that the
// sentinels name when none is yet; it fails while writes are held. moved
// is cancelled when the master it reached is no longer followed.
func (w *masterWatch) dial(ctx context.Context, network string) (conn net.Conn, moved context.Context, err error) {
	w.mu.Lock()
	held, addr, moved := !w.held.IsZero(), w.addr, w.moved
	w.mu.Unlock()
	if held {
		return nil, nil, errFailover
	}
	if addr == "" {
		if _, err := w.resolve(ctx); err != nil {
			return nil, nil, err
		}
		return w.dial(ctx, network)
	}
	conn, err = w.dialer(ctx, network, addr)
	return conn, moved, err
}

// dialPooled is the dialer of the Conn's client, whose pool keeps
// connections: they are masterConns.
func (w *masterWatch) dialPooled(ctx context.Context, network, _ string) (net.Conn, error) {
	c, moved, err := w.dial(ctx, network)
	if err != nil {
		return nil, err
	}
	mc := masterConn{Conn: c, moved: moved}
	if sc, ok := c.(syscall.Conn); ok {
		return &masterSocket{masterConn: mc, socket: sc}, nil
	}
	return &mc, nil
}

// errFormerMaster is the error of a write on a connection to a master that
// is no longer followed: nothing sent.
var errFormerMaster = errors.New("redis: a connection to a former master (nothing sent)")

// masterConn is a pooled connection to the master that the watch followed
// when it was dialed: once it follows another (moved), the connection
// writes nothing more.
type masterConn struct {
	net.Conn
	moved context.Context
}

func (c *masterConn) Write(b []byte) (int, error) {
	if c.moved.Err() != nil {
		return 0, errFormerMaster
	}
	return c.Conn.Write(b)
}

// masterSocket is a masterConn with a socket of its own (not TLS): go-redis
// checks such a connection's socket before each use, and a connection to
// a former master fails the check, so that the pool drops it and dials the
// master followed. (Over TLS, the first write fails instead.)
type masterSocket struct {
	masterConn
	socket syscall.Conn
}

func (c *masterSocket) SyscallConn() (syscall.RawConn, error) {
	if c.moved.Err() != nil {
		return nil, errFormerMaster
	}
	return c.socket.SyscallConn()
}

// onConnect returns the connections' OnConnect: next (may be nil) once a
// data node has said that it is a master (HELLO's role, which every account
// may ask, where ROLE and INFO need @admin or @dangerous). A connection
// to a node that says otherwise is refused, and the sentinels are asked
// again.
func (w *masterWatch) onConnect(next func(ctx context.Context, cn *redis.Conn) error) func(ctx context.Context, cn *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		v, err := cn.Do(ctx, "hello").Result()
		if err != nil {
			return fmt.Errorf("redis: asking the node its role (HELLO): %w", err)
		}
		if role := helloField(v, "role"); role != "master" {
			w.stale()
			return fmt.Errorf("redis: %s says it is a %q, not the master that Sentinel names (nothing sent; asking the sentinels again)", cn.String(), role)
		}
		if next != nil {
			return next(ctx, cn)
		}
		return nil
	}
}

// helloField returns the field of HELLO's reply v (a map in RESP3, a list
// of names and values in RESP2), or "".
func helloField(v any, name string) string {
	switch r := v.(type) {
	case map[any]any:
		s, _ := r[name].(string)
		return s
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			if r[i] == name {
				s, _ := r[i+1].(string)
				return s
			}
		}
	}
	return ""
}

// linkOptions returns base with the watch's dialer, without masterConn:
// the links set their connections up again when the master changes.
func (w *masterWatch) linkOptions(base func(addr string) *redis.Options) func(addr string) *redis.Options {
	return func(addr string) *redis.Options {
		o := base(addr)
		o.Dialer = func(ctx context.Context, network, _ string) (net.Conn, error) {
			c, _, err := w.dial(ctx, network)
			return c, err
		}
		return o
	}
}

// next returns a context that is cancelled when the master changes next.
func (w *masterWatch) next() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.moved
}

// current returns the master followed ("" before the first).
func (w *masterWatch) current() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addr
}

// masterChanged is told that Sentinel's master is another node now (a
// failover). What the Conn knew of the former master does not hold for the
// new one: the pipelines' connections are set up again (links), which
// reads its clock before the next request (another machine's may be ahead
// or behind); then the caller is told (Options.OnMasterChange).
func (c *Conn) masterChanged(from, to string) {
	c.log.Warn("redis: Sentinel names another master; following it", "from", from, "to", to)
	c.links.reconnect("")
	if c.clock != nil {
		c.clock.forget("")
	}
	if c.opts.OnMasterChange != nil {
		c.opts.OnMasterChange(from, to)
	}
}

// OnMasterMove runs f (in a goroutine of its own) when Sentinel's master
// changes next, and returns a function that cancels that; with no Sentinel
// it does nothing. A subscription on Client is moved to the new master so.
func (c *Conn) OnMasterMove(f func()) (stop func() bool) {
	if c.master == nil {
		return func() bool { return false }
	}
	return context.AfterFunc(c.master.next(), f)
}

// Receive hands each message of ps to handle until ps fails, or stays
// silent for ping twice: it is pinged after the first silence.
func Receive(ctx context.Context, ps *redis.PubSub, ping time.Duration, handle func(msg any)) error {
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
