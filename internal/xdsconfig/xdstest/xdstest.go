// Package xdstest runs an xDS management server for tests: go-control-plane's
// state-of-the-world server over its snapshot cache, as Envoy Gateway runs
// it, on a loopback port, with TLS and client certificates when asked. It
// records every DiscoveryRequest so that tests can wait for an ACK or a
// NACK. testpki makes the throw-away PKI that both sides use.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Server is a running management server. Its methods are safe for
// concurrent use.
type Server struct {
	// Addr is the server's host:port on 127.0.0.1.
	Addr  string
	Cache cachev3.SnapshotCache

	stop func()

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every new request or stream
	requests []*discoveryv3.DiscoveryRequest
	streams  int
}

// Start serves on a free loopback port until the test ends (or Stop);
// tlsConfig nil is plaintext; opts are more options of the gRPC server
// (a keepalive enforcement policy).
func Start(tb testing.TB, tlsConfig *tls.Config, opts ...grpc.ServerOption) *Server {
	tb.Helper()
	return StartAt(tb, "127.0.0.1:0", tlsConfig, opts...)
}

// StartAt is Start on addr (a server started again where another was).
func StartAt(tb testing.TB, addr string, tlsConfig *tls.Config, opts ...grpc.ServerOption) *Server {
	tb.Helper()
	s := &Server{Cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), changed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.note(func() { s.streams++ })
			return nil
		},
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			s.note(func() { s.requests = append(s.requests, r) })
			return nil
		},
	}
	xds := serverv3.NewServer(ctx, s.Cache, cb)
	opts = append([]grpc.ServerOption(nil), opts...)
	if tlsConfig != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	gs := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, xds)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	s.Addr = lis.Addr().String()
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(lis)
	}()
	s.stop = sync.OnceFunc(func() {
		cancel()
		gs.Stop()
		<-done
	})
	tb.Cleanup(s.stop)
	return s
}

// Stop closes the listener and every stream, and waits for the server to
// end. It may be called more than once.
func (s *Server) Stop() { s.stop() }

func (s *Server) note(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	close(s.changed)
	s.changed = make(chan struct{})
}

// Push makes configs, at version, the state node sees.
func (s *Server) Push(tb testing.TB, node, version string, configs ...*rlsconfv3.RateLimitConfig) {
	tb.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Cache.SetSnapshot(context.Background(), node, snap); err != nil {
		tb.Fatal(err)
	}
}

// Streams returns how many ADS streams have been opened.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams
}

// WaitFor waits until f, called with every request received so far (and
// the number of streams opened), returns true; at most limit, then the test
// fails with what, naming the wait.
func (s *Server) WaitFor(tb testing.TB, limit time.Duration, what string, f func(reqs []*discoveryv3.DiscoveryRequest, streams int) bool) {
	tb.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok := f(s.requests, s.streams)
		changed := s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("xDS server: no %s within %s", what, limit)
		}
	}
}

// ACKed returns a WaitFor condition: the client acknowledged version.
func ACKed(version string) func([]*discoveryv3.DiscoveryRequest, int) bool {
	return func(reqs []*discoveryv3.DiscoveryRequest, _ int) bool {
		for _, r := range reqs {
			if r.GetResponseNonce() != "" && r.GetErrorDetail() == nil && r.GetVersionInfo() == version {
				return true
			}
		}
		return false
	}
}

// NACKs returns the NACKs among reqs.
func NACKs(reqs []*discoveryv3.DiscoveryRequest) []*discoveryv3.DiscoveryRequest {
	var out []*discoveryv3.DiscoveryRequest
	for _, r := range reqs {
		if r.GetErrorDetail() != nil {
			out = append(out, r)
		}
	}
	return out
}

// Node returns the node of the first request that named one.
func Node(reqs []*discoveryv3.DiscoveryRequest) *corev3.Node {
	for _, r := range reqs {
		if r.GetNode() != nil {
			return r.GetNode()
		}
	}
	return nil
}
