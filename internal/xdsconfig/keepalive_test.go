package xdsconfig_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/rlsproject/rls/internal/xdsconfig"
	"github.com/rlsproject/rls/internal/xdsconfig/xdstest"
)

// stallProxy forwards TCP connections on 127.0.0.1 to a target. Stall
// makes the connections open at that moment forward nothing more, either
// way, while they stay open: a half-open connection (the peer's host gone,
// or a middlebox that stopped forwarding), which TCP alone does not notice
// (the proxy's end answers TCP keepalive probes). Later connections
// forward as before. Safe for concurrent use.
type stallProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	open   []*stallPair // guarded by mu
	closed bool         // guarded by mu
	wg     sync.WaitGroup
}

// stallPair is one proxied connection: its two ends and whether it stalls.
type stallPair struct {
	client, server net.Conn
	stalled        atomic.Bool
}

func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

// stall stops the forwarding of every connection open now.
func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.open {
		c.stalled.Store(true)
	}
}

func (p *stallProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.ln.Close()
	for _, c := range p.open {
		c.client.Close()
		c.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *stallProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		c := &stallPair{client: client, server: server}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.open = append(p.open, c)
		p.mu.Unlock()
		p.wg.Go(func() { c.pump(client, server) })
		p.wg.Go(func() { c.pump(server, client) })
	}
}

// pump copies src to dst until either ends, dropping what it reads once
// the pair stalls.
func (c *stallPair) pump(src, dst net.Conn) {
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !c.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A connection to the management server that stops carrying anything
// (half-open) is noticed by the keepalive ping going unanswered, dropped
// and replaced: a config pushed while it was dead still arrives. Without
// keepalive the client waited on the dead stream for ever.
func TestClientReplacesDeadConnection(t *testing.T) {
	// The server allows the test's frequent pings (grpc-go's default is one
	// per 5 minutes, which DefaultKeepalive respects).
	srv := xdstest.Start(t, nil, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second}))
	proxy := startStallProxy(t, srv.Addr)
	tg := &target{}
	srv.Push(t, "n", "1", egConfig("d", route, 3, rlsconfv3.RateLimitUnit_HOUR))
	// gRPC pings after 10 s of silence at the earliest.
	run(t, xdsconfig.Options{Server: proxy.addr(), NodeID: "n", Backoff: fastBackoff, Keepalive: xdsconfig.Keepalive{Time: 10 * time.Second, Timeout: time.Second}}, tg)
	srv.WaitFor(t, waitLimit, "ACK of version 1", xdstest.ACKed("1"))

	proxy.stall()
	srv.Push(t, "n", "2", egConfig("d", route, 9, rlsconfv3.RateLimitUnit_HOUR))
	// 10 s of silence, 1 s for the ping's answer, the reconnection: well
	// within a minute.
	srv.WaitFor(t, time.Minute, "ACK of version 2 over a new connection", func(reqs []*discoveryv3.DiscoveryRequest, streams int) bool {
		return streams >= 2 && xdstest.ACKed("2")(reqs, streams)
	})
	if v, cfg, _ := tg.state(); v != "2" || limitOf(cfg, "d") != "9/hour" {
		t.Errorf("after the dead connection was replaced: version %q, limit %s; want 2, 9/hour", v, limitOf(cfg, "d"))
	}
}

// The default keepalive respects grpc-go's default enforcement policy
// (pings at least 5 minutes apart), which Envoy Gateway's rate-limit xDS
// server keeps: closer pings on a quiet stream get GOAWAY too_many_pings.
func TestDefaultKeepaliveRespectsServerPolicy(t *testing.T) {
	const grpcDefaultMinTime = 5 * time.Minute // keepalive.EnforcementPolicy's documented default
	if d := xdsconfig.DefaultKeepalive; d.Time < grpcDefaultMinTime || d.Timeout <= 0 {
		t.Errorf("DefaultKeepalive = %+v: want Time ≥ %s (grpc-go servers' default MinTime) and a timeout", d, grpcDefaultMinTime)
	}
}
