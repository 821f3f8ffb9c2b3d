// Package servetest starts what the tests of the transports and of cmd/rls
// need in process: a service with a config on a memory store at a fixed
// instant, a gRPC server on loopback with a client connection, free
// loopback addresses (proctest's), and a bounded wait for an event in
// another goroutine or process. Everything it starts is stopped when the
// test ends. It is for tests only and knows no protocol beyond starting a
// gRPC server; SyncBuffer takes a log written by another goroutine. Child
// processes are proctest's.
package servetest

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/service"
)

// Addr returns a loopback address ("127.0.0.1:port") whose port was free a
// moment ago, for a server that must be given its address up front (drawn
// as proctest.Addr draws it: below the kernel's ephemeral range).
func Addr(t testing.TB) string {
	t.Helper()
	return proctest.Addr(t)
}

// FreePort returns a loopback TCP port that was free a moment ago, for a
// server (another process, often) that must be given its port up front
// (proctest.Port).
func FreePort(t testing.TB) int {
	t.Helper()
	return proctest.Port(t)
}

// Listen returns a listener on a free loopback port, closed when the test
// ends (closing it earlier is fine).
func Listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// Config parses yaml as the file test.yaml, failing the test on an error.
func Config(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// MemoryStore returns a memory store whose clock is now (a clock stopped at
// storetest.T0 when nil), closed when the test ends.
func MemoryStore(t testing.TB, now func() time.Time) *memstore.Store {
	if now == nil {
		now = storetest.NewClock(storetest.T0).Now
	}
	s := memstore.New(memstore.Options{Now: now})
	t.Cleanup(func() { s.Close() })
	return s
}

// Service returns a service built with opts, holding the config yaml. When
// opts.Store is nil it decides on MemoryStore(t, nil): every request at the
// same instant, so that a test of a per-second limit never straddles a
// second.
func Service(t testing.TB, yaml string, opts service.Options) *service.Service {
	t.Helper()
	cfg := Config(t, yaml)
	if opts.Store == nil {
		opts.Store = MemoryStore(t, nil)
	}
	svc := service.New(opts)
	svc.SetConfig(cfg)
	return svc
}

// GRPC serves what register registers on a gRPC server with opts, on a
// loopback listener, and returns a plaintext client connection to it. The
// server and the connection stop when the test ends.
func GRPC(t testing.TB, register func(*grpc.Server), opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	l := Listen(t)
	gs := grpc.NewServer(opts...)
	register(gs)
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(l)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return Dial(t, l.Addr().String())
}

// Dial returns a plaintext gRPC client connection to addr, closed when the
// test ends.
func Dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Eventually calls cond until it returns true, and fails the test when it
// has not after 10 seconds. It waits for an event that another goroutine or
// process brings about (a reload, a listener that starts); it is not a
// measure of time, and the bound only keeps a broken test from hanging.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SyncBuffer is a bytes.Buffer that a server or watcher under test writes
// its log into while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
