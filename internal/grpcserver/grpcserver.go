// Package grpcserver holds the grpc-go server settings of rls, shared with
// the load harness's bare ceiling server so that a comparison measures rls's
// own work and not different transport settings.
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

// Options returns the server options.
func Options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Serve streams on long-lived worker goroutines, enough for the
		// concurrency of a busy Envoy fleet: a fresh goroutine per request
		// grows its stack anew every time (copystack was 14% of the CPU).
		grpc.NumStreamWorkers(uint32(64 * runtime.GOMAXPROCS(0))),
	}
}
