// Package grpcserver holds the grpc-go server settings of rls, shared with
// the load harness's bare ceiling server so that a comparison measures rls's
// own work and not different transport settings. It knows no service.
package grpcserver

import (
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// maxMessage bounds a request: far above what the service's request bounds
// allow, far below grpc-go's 4 MiB default.
const maxMessage = 1 << 20

// The defaults of Limits.
const (
	// DefaultMaxStreams bounds the concurrent streams of one connection. A
	// stream that never sends its request holds a goroutine and buffers
	// (about 11 KiB): one connection holding 100,000 of them took 1.15 GB
	// without a bound. Envoy opens another connection when one is full.
	DefaultMaxStreams = 1024
	// DefaultMaxConnectionAge and DefaultMaxConnectionAgeGrace are
	// envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE and
	// GRPC_MAX_CONNECTION_AGE_GRACE: after the age the server asks the
	// client to go elsewhere (GOAWAY), so that a long-lived connection is
	// rebalanced over replicas, and after the grace it closes the connection
	// with whatever it still holds.
	DefaultMaxConnectionAge      = 24 * time.Hour
	DefaultMaxConnectionAgeGrace = time.Hour
)

// Limits bound what gRPC clients can hold of the server. A zero field means
// its default.
type Limits struct {
	MaxStreams            uint32
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
}

// Options returns the server options within limits l.
func Options(l Limits) []grpc.ServerOption {
	if l.MaxStreams == 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.MaxConnectionAge == 0 {
		l.MaxConnectionAge = DefaultMaxConnectionAge
	}
	if l.MaxConnectionAgeGrace == 0 {
		l.MaxConnectionAgeGrace = DefaultMaxConnectionAgeGrace
	}
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.MaxConcurrentStreams(l.MaxStreams),
		// A client may ping at most every 10 s (Envoy's default keepalive is
		// off, gRPC clients' is minutes); one that pings more often is sent
		// GOAWAY, so pings cannot keep the server busy.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      l.MaxConnectionAge,
			MaxConnectionAgeGrace: l.MaxConnectionAgeGrace,
		}),
		// Serve streams on long-lived worker goroutines, enough for the
		// concurrency of a busy Envoy fleet: a fresh goroutine per request
		// grows its stack anew every time (copystack was 14% of the CPU).
		grpc.NumStreamWorkers(uint32(64 * runtime.GOMAXPROCS(0))),
	}
}
