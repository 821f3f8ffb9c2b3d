package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"

	"github.com/redis/go-redis/v9"
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
// name, with ro's settings (failoverOptions), and TLS for the master and
// the sentinels alike, each verified under the address it is reached at
// (ro's ServerName, the URL's ignored host, is dropped). The client asks a
// sentinel where the master is at every new connection, and drops its
// connections to a former master when a sentinel announces a failover.
// onChange runs when a new connection reaches another node than the one
// before (see masterWatch).
func newFailoverClient(sen *Sentinel, ro *redis.Options, onChange func(from, to string)) (redis.UniversalClient, *masterWatch, error) {
	if sen.Master == "" || len(sen.Addrs) == 0 {
		return nil, nil, fmt.Errorf("redis sentinel: %q and %q: a master name and at least one sentinel host:port are needed", sen.Master, sen.Addrs)
	}
	for _, a := range sen.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, nil, fmt.Errorf("redis sentinel address %q: %w", a, err)
		}
	}
	cfg := ro.TLSConfig
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.ServerName = ""
	}
	c := redis.NewFailoverClient(failoverOptions(sen, ro, cfg))
	w := newMasterWatch(onChange)
	c.AddHook(w)
	return c, w, nil
}

// failoverOptions returns the options of a failover client of sen's master
// with ro's credentials, database, timeouts, retries and pool, and cfg for
// TLS. ro's Dialer is not taken: the failover client dials the address a
// sentinel gives with its own dialer, and a dialer of ours would replace
// its TLS.
func failoverOptions(sen *Sentinel, ro *redis.Options, cfg *tls.Config) *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName:       sen.Master,
		SentinelAddrs:    sen.Addrs,
		SentinelUsername: sen.Username,
		SentinelPassword: sen.Password,

		ClientName: ro.ClientName,
		OnConnect:  ro.OnConnect,
		Protocol:   ro.Protocol,
		Username:   ro.Username,
		Password:   ro.Password,
		DB:         ro.DB,
		TLSConfig:  cfg,

		// No retries, as for a single node (see New): a script that ran
		// must not run again.
		MaxRetries:      ro.MaxRetries,
		MinRetryBackoff: ro.MinRetryBackoff,
		MaxRetryBackoff: ro.MaxRetryBackoff,

		DialTimeout:           ro.DialTimeout,
		DialerRetries:         ro.DialerRetries,
		DialerRetryTimeout:    ro.DialerRetryTimeout,
		DialerRetryBackoff:    ro.DialerRetryBackoff,
		ReadTimeout:           ro.ReadTimeout,
		WriteTimeout:          ro.WriteTimeout,
		ContextTimeoutEnabled: ro.ContextTimeoutEnabled,

		PoolFIFO:        ro.PoolFIFO,
		PoolSize:        ro.PoolSize,
		PoolTimeout:     ro.PoolTimeout,
		MinIdleConns:    ro.MinIdleConns,
		MaxIdleConns:    ro.MaxIdleConns,
		MaxActiveConns:  ro.MaxActiveConns,
		ConnMaxIdleTime: ro.ConnMaxIdleTime,
		ConnMaxLifetime: ro.ConnMaxLifetime,

		DisableIdentity: ro.DisableIdentity,
		IdentitySuffix:  ro.IdentitySuffix,
	}
}

// masterWatch follows which node a Sentinel-backed client reaches, from the
// connections it opens: go-redis dials the node that a sentinel names as
// the master, and drops the connections to another one when a sentinel
// announces a failover. When a new connection reaches another node than
// the one before, the master has changed: onChange runs (in the dialing
// goroutine), and the context of the last change is cancelled. Its zero
// value is not usable; safe for concurrent use.
type masterWatch struct {
	onChange func(from, to string)

	mu    sync.Mutex
	addr  string             // the node that the latest new connection reached; guarded by mu
	moved context.Context    // cancelled at the next change; guarded by mu
	move  context.CancelFunc // cancels moved; guarded by mu
}

var _ redis.Hook = (*masterWatch)(nil)

func newMasterWatch(onChange func(from, to string)) *masterWatch {
	w := &masterWatch{onChange: onChange}
	w.moved, w.move = context.WithCancel(context.Background())
	return w
}

// DialHook notes the node each new connection reaches.
func (w *masterWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err == nil {
			w.reached(conn.RemoteAddr().String())
		}
		return conn, err
	}
}

func (w *masterWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (w *masterWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// reached records that a new connection reached addr.
func (w *masterWatch) reached(addr string) {
	w.mu.Lock()
	from := w.addr
	w.addr = addr
	changed := from != "" && from != addr
	if changed {
		w.move()
		w.moved, w.move = context.WithCancel(context.Background())
	}
	w.mu.Unlock()
	if changed && w.onChange != nil {
		w.onChange(from, addr)
	}
}

// next returns a context that is cancelled when the master changes next.
func (w *masterWatch) next() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.moved
}

// current returns the node that the latest new connection reached ("" before
// the first).
func (w *masterWatch) current() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addr
}

// masterChanged is told that Sentinel's master is another node now (a
// failover). What the store knew of the former master does not hold for
// the new one: the pipelines' connections are set up again (links), which
// reads its clock before the next request (another
// machine's may be ahead or behind), and the denial cache starts empty
// and stays off until its subscription is confirmed on the new master
// (replication is asynchronous: hits the former master counted, and
// notices it published, may never have reached the new one).
func (s *Store) masterChanged(from, to string) {
	s.log.Warn("redis: Sentinel names another master; following it", "from", from, "to", to)
	s.links.reconnect("")
	if s.clock != nil {
		s.clock.forget("")
	}
	if s.cache != nil {
		s.cache.setLive(false)
	}
}

// onMasterMove runs f (in a goroutine of its own) when Sentinel's master
// changes next, and returns a function that cancels that; with no Sentinel
// it does nothing.
func (s *Store) onMasterMove(f func()) (stop func() bool) {
	if s.master == nil {
		return func() bool { return false }
	}
	return context.AfterFunc(s.master.next(), f)
}
