package rlqs

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/config"
	grants "github.com/rlsproject/rls/internal/engine/grant"
	"github.com/rlsproject/rls/internal/service"
)

// Limits of the service, per stream, per connection and in all: what a
// client can make the server hold.
const (
	// MaxBuckets is the most buckets one stream may report: a report of
	// one more ends the stream (RESOURCE_EXHAUSTED).
	MaxBuckets = 10000
	// MaxStreamBytes bounds what one stream's bucket ids hold: their keys
	// and values and bucketOverhead each. A report past it ends the stream
	// (RESOURCE_EXHAUSTED).
	MaxStreamBytes = 4 << 20
	// MaxBytes bounds the same over all streams.
	MaxBytes = 256 << 20
	// MaxStreams is the most streams served at once.
	MaxStreams = 10000
	// MaxStreamsPerConnection is the most streams one client connection
	// may hold at once (an Envoy opens one per filter config).
	MaxStreamsPerConnection = 64
	// DefaultFirstReport is how long a stream may stay without its first
	// report (Envoy sends it as it opens the stream).
	DefaultFirstReport = 10 * time.Second

	// maxBucketKeys bounds a bucket id's keys, as a descriptor's entries;
	// maxBucketBytes its keys' and values' bytes, so that with the domain
	// they make a valid request.
	maxBucketKeys  = config.MaxDepth
	maxBucketBytes = service.MaxRequestBytes - service.MaxDomainLen
	// bucketOverhead is what a bucket costs beyond its id's bytes.
	bucketOverhead = 512
)

// Defaults of Options.
const (
	// DefaultInterval is the reporting interval assumed of a client until
	// two of its reports show its own (Envoy's filter reports every 5 s).
	DefaultInterval = 5 * time.Second
	// unlimitedTTL is the time to live of ALLOW_ALL for a bucket without
	// limits: a reload that gives it limits is applied at its next report.
	unlimitedTTL = time.Hour
	// tickLate is how long after a window boundary the server pays the
	// new window: its payment must be counted in it.
	tickLate = 2 * time.Millisecond
)

// Options configure a Server.
type Options struct {
	// Now is the clock; nil is time.Now. It must be the store's.
	Now func() time.Time
	// StoreTimeout is the store's bound on a decision once sent: a grant's
	// unused requests are released only when that surely lands in the
	// window they were counted in (grant.ReleaseLands).
	StoreTimeout time.Duration
	// FirstReport is how long a stream may stay without a report before it
	// is ended (DEADLINE_EXCEEDED); 0 is DefaultFirstReport.
	FirstReport time.Duration
	// Tracer, when not nil, makes a span of each report (tracing.go); nil
	// makes none.
	Tracer trace.Tracer
}

// Server is the RLQS service. Safe for concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	svc     *service.Service
	opts    Options
	streams chan struct{} // a token per stream served
	bytes   atomic.Int64  // what all sessions' bucket ids count against MaxBytes
	ledger  grants.Ledger // what became of the tokens taken for assignments
	metrics *metrics

	mu    sync.Mutex
	conns map[string]int            // streams served per client connection
	live  map[*Session]StreamStatus // the streams served, for Streams
}

// New returns the service answering from svc's config and store.
func New(svc *service.Service, opts Options) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.FirstReport <= 0 {
		opts.FirstReport = DefaultFirstReport
	}
	s := &Server{svc: svc, opts: opts, streams: make(chan struct{}, MaxStreams), conns: make(map[string]int),
		live: make(map[*Session]StreamStatus)}
	s.metrics = newMetrics(func() float64 { return float64(len(s.streams)) }, &s.ledger)
	return s
}

// Register registers the service on gs.
func (s *Server) Register(gs *grpc.Server) { rlqsv3.RegisterRateLimitQuotaServiceServer(gs, s) }

// StreamRateLimitQuotas implements the service: one Session per stream,
// an answer per report, and the messages of the session's ticks between
// them.
func (s *Server) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	ctx := stream.Context()
	done, err := s.admit(ctx)
	if err != nil {
		return err
	}
	defer done()
	// A stream that ends leaves its grants counted until their windows
	// end: its client may still be spending them.
	ss := s.NewSession()
	defer ss.end()
	p, _ := peer.FromContext(ctx)
	s.track(ss, p)
	defer s.untrack(ss)

	// The stream's reports, read by a goroutine of this handler's: it ends
	// when Recv fails, at the latest when the handler has returned and
	// gRPC has ended the stream.
	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	failed := make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				failed <- err
				return
			}
			select {
			case reports <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	first := time.NewTimer(s.opts.FirstReport)
	defer first.Stop()
	tick := time.NewTimer(time.Hour)
	tick.Stop()
	defer tick.Stop()
	for {
		var resp *rlqsv3.RateLimitQuotaResponse
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case err := <-failed:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-first.C:
			return status.Errorf(codes.DeadlineExceeded, "no usage report within %v of the stream's start", s.opts.FirstReport)
		case r := <-reports:
			first.Stop()
			resp, err = s.report(ctx, ss, r)
		case <-tick.C:
			resp, err = ss.Tick(ctx)
		}
		if err != nil {
			return err
		}
		if len(resp.GetBucketAction()) > 0 {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		if next, ok := ss.NextTick(); ok {
			tick.Reset(max(next.Sub(s.opts.Now()), 0) + tickLate)
		}
	}
}

// admit takes a place for a stream of ctx's connection, and returns what
// gives it back.
func (s *Server) admit(ctx context.Context) (func(), error) {
	select {
	case s.streams <- struct{}{}:
	default:
		return nil, status.Errorf(codes.ResourceExhausted, "rls serves %d RLQS streams at most", MaxStreams)
	}
	conn := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		conn = p.Addr.String()
		if p.LocalAddr != nil {
			conn += " " + p.LocalAddr.String()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns[conn] >= MaxStreamsPerConnection {
		<-s.streams
		return nil, status.Errorf(codes.ResourceExhausted, "a connection may hold %d RLQS streams at most", MaxStreamsPerConnection)
	}
	s.conns[conn]++
	return func() {
		s.mu.Lock()
		if s.conns[conn]--; s.conns[conn] == 0 {
			delete(s.conns, conn)
		}
		s.mu.Unlock()
		<-s.streams
	}, nil
}

// claimBytes counts n more bytes of bucket ids against MaxBytes, and
// says whether they fit (when not, nothing is counted).
func (s *Server) claimBytes(n int) bool {
	if s.bytes.Add(int64(n)) > MaxBytes {
		s.bytes.Add(-int64(n))
		return false
	}
	return true
}
