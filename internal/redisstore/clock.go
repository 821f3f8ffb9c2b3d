package redisstore

import (
	"sync"
	"time"
)

// redisClock relates this process's clock to each Redis node's (TIME, at
// which the scripts decide), so that a request's deadline can be sent in
// the node's clock and the script can refuse to decide a request whose
// caller has stopped waiting.
//
// For each node it keeps a lower bound of the node's lead over the local
// clock: a reply decided at the node's instant r and received locally at l
// was decided no later than l, so the lead is at least r - l. The best
// (largest) bound of the last two periods is used: a deadline sent as
// local deadline + bound is never later in the node's clock than the local
// one (the script refuses early rather than late), unless the node's clock
// has stepped back in the last two periods. Local instants are read on the
// monotonic clock, so a step of the local wall clock changes nothing.
//
// Safe for concurrent use.
type redisClock struct {
	origin      time.Time // local instants are µs since origin (monotonic) plus originMicro
	originMicro int64

	mu    sync.Mutex
	nodes map[string]*nodeClock // by node address ("" for a single node); guarded by mu
}

// nodeClock is what redisClock knows of one node.
type nodeClock struct {
	seen   bool
	period int64 // the period of best
	best   int64 // the largest bound of that period
	prev   int64 // the largest bound of the period before
}

// clockPeriod is how long a bound of the lead is trusted before a newer
// one replaces it: the bounds of the last two periods count.
const clockPeriod = time.Second

func newRedisClock() *redisClock {
	now := time.Now()
	return &redisClock{origin: now, originMicro: now.UnixMicro(), nodes: make(map[string]*nodeClock)}
}

// micros returns the local instant t in µs since the epoch, on the
// monotonic clock.
func (c *redisClock) micros(t time.Time) int64 {
	return c.originMicro + t.Sub(c.origin).Microseconds()
}

func (c *redisClock) node(addr string) *nodeClock {
	n := c.nodes[addr]
	if n == nil {
		n = &nodeClock{}
		c.nodes[addr] = n
	}
	return n
}

// sample records that node addr decided at its instant redisMicro a reply
// received locally at recv.
func (c *redisClock) sample(addr string, redisMicro int64, recv time.Time) {
	lead := redisMicro - c.micros(recv)
	period := int64(recv.Sub(c.origin) / clockPeriod)
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.node(addr)
	switch {
	case !n.seen:
		n.seen, n.period, n.best, n.prev = true, period, lead, lead
	case period == n.period:
		n.best = max(n.best, lead)
	case period == n.period+1:
		n.period, n.prev, n.best = period, n.best, lead
	default:
		n.period, n.prev, n.best = period, lead, lead
	}
}

// toRedis returns the local instant t in node addr's clock (µs), and false
// when no reply of that node has been seen yet.
func (c *redisClock) toRedis(addr string, t time.Time) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[addr]
	if n == nil || !n.seen {
		return 0, false
	}
	return c.micros(t) + max(n.best, n.prev), true
}

// known reports whether node addr has been sampled.
func (c *redisClock) known(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[addr]
	return n != nil && n.seen
}
