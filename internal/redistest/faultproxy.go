package redistest

import (
	"bytes"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FaultProxy is a TCP proxy on 127.0.0.1 between a client and a server
// (Redis) that does to the traffic what a network does: delays it, drops it,
// or cuts a connection after the server has answered. Faults can change
// while connections are open; Heal ends them. Safe for concurrent use.
type FaultProxy struct {
	ln     net.Listener
	target string

	latency   atomic.Int64 // ns added to every chunk, each way
	replyLag  atomic.Int64 // ns added to server-to-client chunks on top
	blackHole atomic.Bool  // bytes vanish, both ways
	cutEvery  atomic.Int64 // every n-th reply to a marked request is dropped and its connection reset
	cutMarker atomic.Value // string: what a request's bytes contain to be marked
	replies   atomic.Int64 // replies to marked requests seen
	cuts      atomic.Int64 // connections cut
	hold      atomic.Int64 // ns a new connection waits before carrying bytes
	accepted  atomic.Int64 // connections accepted

	mu     sync.Mutex
	conns  map[net.Conn]bool // guarded by mu
	closed bool              // guarded by mu
	wg     sync.WaitGroup
}

// StartFaultProxy starts a proxy to target; the test's cleanup stops it and
// closes its connections.
func StartFaultProxy(tb testing.TB, target string) *FaultProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: fault proxy: %v", err)
	}
	p := &FaultProxy{ln: ln, target: target, conns: make(map[net.Conn]bool)}
	p.wg.Go(p.accept)
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port, where clients connect.
func (p *FaultProxy) Addr() string { return p.ln.Addr().String() }

// Port returns the proxy's port.
func (p *FaultProxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetLatency delays every chunk by d in each direction (a round trip gains
// 2d), keeping their order.
func (p *FaultProxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// SetReplyDelay delays the server's replies by d more than the requests:
// a network whose way back is the slow one.
func (p *FaultProxy) SetReplyDelay(d time.Duration) { p.replyLag.Store(int64(d)) }

// SetBlackHole makes bytes vanish in both directions while on: requests
// never reach the server, replies never reach the client.
func (p *FaultProxy) SetBlackHole(on bool) { p.blackHole.Store(on) }

// CutEveryReply drops the reply to every n-th request (from now on) whose
// bytes contain marker, and resets that connection both ways: the server
// has run the request, its client never hears of it. Requests are told
// apart by the chunk that carries them, so it is meant for clients with one
// request in flight per connection. The marker is matched in any case.
// 0 stops it.
func (p *FaultProxy) CutEveryReply(n int, marker string) {
	p.cutMarker.Store(marker)
	p.replies.Store(0)
	p.cutEvery.Store(int64(n))
}

// Cuts returns how many connections CutEveryReply has reset.
func (p *FaultProxy) Cuts() int { return int(p.cuts.Load()) }

// SetConnectDelay makes every new connection wait d before the first byte
// passes either way, as the setup of a connection to a far or loaded
// server does (the client's connect succeeds at once; its handshake, TLS
// or Redis's, waits). Connections already open are not delayed.
func (p *FaultProxy) SetConnectDelay(d time.Duration) { p.hold.Store(int64(d)) }

// Accepted returns how many connections the proxy has accepted.
func (p *FaultProxy) Accepted() int { return int(p.accepted.Load()) }

// ResetConnections resets every open connection both ways, as a network
// that drops them; the proxy keeps accepting new ones.
func (p *FaultProxy) ResetConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// Heal ends every fault.
func (p *FaultProxy) Heal() {
	p.SetLatency(0)
	p.SetReplyDelay(0)
	p.SetBlackHole(false)
	p.CutEveryReply(0, "")
	p.SetConnectDelay(0)
}

// Close stops the proxy and closes its connections.
func (p *FaultProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track adds c to the open connections; false when the proxy is closed.
func (p *FaultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *FaultProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *FaultProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		if !p.track(client) {
			client.Close()
			return
		}
		p.wg.Go(func() { p.connect(client, time.Duration(p.hold.Load())) })
	}
}

// connect joins client, accepted, to a new connection to the target after
// hold, and copies between them until either ends.
func (p *FaultProxy) connect(client net.Conn, hold time.Duration) {
	if hold > 0 {
		time.Sleep(hold)
	}
	server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		p.untrack(client)
		return
	}
	if !p.track(server) {
		server.Close()
		p.untrack(client)
		return
	}
	reset := func() {
		// Linger 0: the peers see a reset, not an orderly close.
		for _, c := range []net.Conn{client, server} {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
		}
		p.untrack(client)
		p.untrack(server)
	}
	var once sync.Once
	end := func() { once.Do(reset) }
	var marked atomic.Int64 // marked requests on this connection not yet answered
	p.wg.Go(func() { p.pump(client, server, false, &marked, end) })
	p.wg.Go(func() { p.pump(server, client, true, &marked, end) })
}

// chunk is bytes read at one instant, to be written once their delay is up.
type chunk struct {
	b  []byte
	at time.Time
}

// pump copies src to dst with the proxy's faults; replies marks the
// server-to-client direction; marked counts the connection's requests that
// CutEveryReply watches and that are not answered yet. It ends both
// connections when either ends.
func (p *FaultProxy) pump(src, dst net.Conn, replies bool, marked *atomic.Int64, end func()) {
	defer end()
	out := make(chan chunk, 1024)
	var writer sync.WaitGroup
	writer.Go(func() {
		defer end()
		for c := range out {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				for range out { // drain: the reader ends on its own error
				}
				return
			}
		}
	})
	defer writer.Wait()
	defer close(out)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackHole.Load() {
			if every := p.cutEvery.Load(); every > 0 {
				marker, _ := p.cutMarker.Load().(string)
				switch {
				case !replies && marker != "" && bytes.Contains(bytes.ToUpper(buf[:n]), []byte(strings.ToUpper(marker))):
					marked.Add(1)
				case replies && marked.Load() > 0:
					marked.Add(-1)
					if p.replies.Add(1)%every == 0 {
						p.cuts.Add(1)
						return // dropped, and the connection reset by end
					}
				}
			}
			delay := time.Duration(p.latency.Load())
			if replies {
				delay += time.Duration(p.replyLag.Load())
			}
			out <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now().Add(delay)}
		}
		if err != nil {
			return
		}
	}
}
