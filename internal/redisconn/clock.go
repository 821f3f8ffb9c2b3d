package redisconn

import (
	"sync"
	"time"
)

// redisClock relates this process's clock to each Redis node's (TIME, at
// which the scripts decide), so that a request's deadline can be sent in
// the node's clock and the script can refuse to decide a request whose
// caller has stopped waiting.
//
// For each node it estimates the node's lead over the local clock from
// replies: one decided at the node's instant r, on a call sent locally at s
// and received at e, was decided between s and e, so the lead is r minus
// their middle, within half the round trip. The estimate is that of the
// fastest round trip of the last two periods (a busy moment's slow replies
// do not spoil it, and a step of the node's clock is followed within two
// periods). Its error, half that round trip (tens of microseconds on a
// loopback or a LAN), is far below the grace a caller waits past its
// deadline and the window in which decisions carry their undo logs. Local
// instants are read on the monotonic clock, so a step of the local wall
// clock changes nothing.
//
// Safe for concurrent use.
type redisClock struct {
	origin      time.Time // local instants are µs since origin (monotonic) plus originMicro
	originMicro int64

	mu    sync.Mutex
	nodes map[string]*nodeClock // by node address ("" for a single node); guarded by mu
}

// nodeClock is what redisClock knows of one node: for the current period
// and the one before, the lead estimated from its fastest round trip.
type nodeClock struct {
	seen      bool
	period    int64
	lead, rtt int64 // the current period's
	prevLead  int64
	prevRTT   int64
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

// sample records that node addr decided at its instant redisMicro a call
// sent locally at sent and answered at recv.
func (c *redisClock) sample(addr string, redisMicro int64, sent, recv time.Time) {
	s, e := c.micros(sent), c.micros(recv)
	lead, rtt := redisMicro-(s+e)/2, e-s
	period := int64(recv.Sub(c.origin) / clockPeriod)
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.node(addr)
	switch {
	case !n.seen:
		n.seen, n.period, n.lead, n.rtt, n.prevLead, n.prevRTT = true, period, lead, rtt, lead, rtt
	case period == n.period:
		if rtt < n.rtt {
			n.lead, n.rtt = lead, rtt
		}
	case period == n.period+1:
		n.period, n.prevLead, n.prevRTT, n.lead, n.rtt = period, n.lead, n.rtt, lead, rtt
	default:
		n.period, n.prevLead, n.prevRTT, n.lead, n.rtt = period, lead, rtt, lead, rtt
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
	lead := n.lead
	if n.prevRTT < n.rtt {
		lead = n.prevLead
	}
	return c.micros(t) + lead, true
}

// known reports whether node addr has been sampled.
func (c *redisClock) known(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[addr]
	return n != nil && n.seen
}

// forget drops what is known of node addr's clock: another server answers
// under that name now (the master that Sentinel names after a failover,
// maybe on a machine whose clock is ahead or behind). Until a reply of it
// is seen, known reports false, and a request waits for a TIME first.
func (c *redisClock) forget(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nodes, addr)
}
