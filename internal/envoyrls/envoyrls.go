// Package envoyrls is the adapter of Envoy's RateLimitService v3, over gRPC
// and as envoyproxy/ratelimit's POST /json (proto3 JSON): it decodes
// RateLimitRequest (with a codec of its own that accepts any bytes in
// strings and bounds a request while decoding it), converts it to a
// service.Request and the service.Response back, and maps errors to gRPC
// codes or HTTP statuses. It holds no rate-limit logic.
package envoyrls

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/service"
)

// Checker decides rate-limit requests; *service.Service implements it.
type Checker interface {
	ShouldRateLimit(ctx context.Context, req *service.Request) (*service.Response, error)
}

// Server implements rlsv3.RateLimitServiceServer. It is safe for concurrent
// use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc      Checker
	requests sync.Pool // *request
	conv     converter
}

// New returns a server that asks svc.
func New(svc Checker) *Server {
	s := &Server{svc: svc}
	s.requests.New = func() any { return new(request) }
	return s
}

// Register registers s on g. With ServerCodec among g's options, requests
// are checked for their shape while they are decoded (see ServerCodec);
// with another protobuf codec they are decoded as that codec does.
func (s *Server) Register(g *grpc.Server) { g.RegisterService(&serviceDesc, s) }

// serviceDesc is rlsv3.RateLimitService_ServiceDesc with a handler that
// decodes into a wireRequest, so that ServerCodec can say why it refused a
// request: an error returned by a codec would reach the client as
// INTERNAL, never as InvalidArgument.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: rlsv3.RateLimitService_ServiceDesc.HandlerType,
	Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimitHandler}},
	Metadata:    rlsv3.RateLimitService_ServiceDesc.Metadata,
}

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := &wireRequest{RateLimitRequest: new(rlsv3.RateLimitRequest)}
	if err := dec(in); err != nil {
		return nil, err
	}
	if in.invalid != nil {
		return nil, grpcStatus(in.invalid)
	}
	s := srv.(*Server)
	if interceptor == nil {
		return s.ShouldRateLimit(ctx, in.RateLimitRequest)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, in.RateLimitRequest, info, func(ctx context.Context, req any) (any, error) {
		return s.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	})
}

// ShouldRateLimit implements the RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decide(ctx, in)
	if err != nil {
		return nil, grpcStatus(err)
	}
	return resp, nil
}

// decide converts in, asks the service and converts its answer; errors are
// the service's.
func (s *Server) decide(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	r := s.requests.Get().(*request)
	r.fromProto(in)
	resp, err := s.svc.ShouldRateLimit(ctx, &r.req)
	r.reset()
	s.requests.Put(r)
	if err != nil {
		return nil, err
	}
	return s.conv.toProto(resp), nil
}

// errorCode classifies an error of the service: the one mapping behind the
// gRPC status (grpcStatus) and the HTTP status (HTTPStatus) of an answer.
func errorCode(err error) codes.Code {
	var inv *service.InvalidError
	switch {
	case errors.As(err, &inv):
		return codes.InvalidArgument
	case errors.Is(err, service.ErrStoreUnavailable):
		return codes.Unavailable
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return codes.Internal
}

// grpcStatus converts an error of the service to a gRPC status error.
func grpcStatus(err error) error { return status.Error(errorCode(err), err.Error()) }

// request is a converted request with the backing array of its entries,
// reused through a pool.
type request struct {
	req     service.Request
	entries []config.Entry
}

// fromProto converts in, reusing r's slices.
func (r *request) fromProto(in *rlsv3.RateLimitRequest) {
	req := &r.req
	req.Domain, req.HitsAddend = in.GetDomain(), in.GetHitsAddend()
	nd := len(in.GetDescriptors())
	if cap(req.Descriptors) < nd {
		req.Descriptors = make([]service.Descriptor, nd)
	}
	req.Descriptors = req.Descriptors[:nd]
	n := 0
	for _, d := range in.GetDescriptors() {
		n += len(d.GetEntries())
	}
	if cap(r.entries) < n {
		r.entries = make([]config.Entry, n)
	}
	entries := r.entries[:n]
	for i, d := range in.GetDescriptors() {
		out := &req.Descriptors[i]
		*out = service.Descriptor{}
		es := entries[:len(d.GetEntries()):len(d.GetEntries())]
		entries = entries[len(d.GetEntries()):]
		for j, e := range d.GetEntries() {
			es[j] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		out.Entries = es
		if h := d.GetHitsAddend(); h != nil {
			out.HasHits, out.Hits = true, h.GetValue()
		}
		out.Refund = d.GetIsNegativeHits()
		if o := d.GetLimit(); o != nil {
			out.Override = &service.Override{
				RequestsPerUnit: o.GetRequestsPerUnit(),
				Unit:            unitFromProto(o.GetUnit()),
				UnitMultiplier:  o.GetUnitMultiplier().GetValue(),
			}
		}
	}
}

// reset drops the references to the request's strings before pooling.
func (r *request) reset() {
	clear(r.req.Descriptors[:cap(r.req.Descriptors)])
	clear(r.entries)
	r.req.Domain = ""
}

func unitFromProto(u typev3.RateLimitUnit) engine.Unit {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return engine.Second
	case typev3.RateLimitUnit_MINUTE:
		return engine.Minute
	case typev3.RateLimitUnit_HOUR:
		return engine.Hour
	case typev3.RateLimitUnit_DAY:
		return engine.Day
	case typev3.RateLimitUnit_MONTH:
		return engine.Month
	case typev3.RateLimitUnit_YEAR:
		return engine.Year
	}
	return engine.UnitUnknown
}

var unitToProto = [...]rlsv3.RateLimitResponse_RateLimit_Unit{
	engine.UnitUnknown: rlsv3.RateLimitResponse_RateLimit_UNKNOWN,
	engine.Second:      rlsv3.RateLimitResponse_RateLimit_SECOND,
	engine.Minute:      rlsv3.RateLimitResponse_RateLimit_MINUTE,
	engine.Hour:        rlsv3.RateLimitResponse_RateLimit_HOUR,
	engine.Day:         rlsv3.RateLimitResponse_RateLimit_DAY,
	engine.Week:        rlsv3.RateLimitResponse_RateLimit_WEEK,
	engine.Month:       rlsv3.RateLimitResponse_RateLimit_MONTH,
	engine.Year:        rlsv3.RateLimitResponse_RateLimit_YEAR,
}

var codeToProto = [...]rlsv3.RateLimitResponse_Code{
	service.OK:        rlsv3.RateLimitResponse_OK,
	service.OverLimit: rlsv3.RateLimitResponse_OVER_LIMIT,
}

// converter builds responses, sharing the immutable parts between them:
// the current_limit of each configured limit and the common durations.
// (protobuf-go marshals a message concurrently safely: its size cache is
// atomic.) The zero value is ready; safe for concurrent use.
type converter struct {
	limits    sync.Map // *config.Limit → *rlsv3.RateLimitResponse_RateLimit
	nlimits   atomic.Int64
	durations [maxSharedDuration + 1]atomic.Pointer[durationpb.Duration]
}

const (
	maxSharedDuration = 3600  // seconds
	maxSharedLimits   = 10000 // then the cache starts over (config reloads)
)

func (c *converter) currentLimit(l *config.Limit) *rlsv3.RateLimitResponse_RateLimit {
	if l.Index >= 0 {
		if v, ok := c.limits.Load(l); ok {
			return v.(*rlsv3.RateLimitResponse_RateLimit)
		}
	}
	rpu, unit, mult := currentLimitOf(l)
	rl := &rlsv3.RateLimitResponse_RateLimit{
		Name:            l.Name,
		RequestsPerUnit: rpu,
		Unit:            unitToProto[unit],
	}
	if mult > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	if l.Index >= 0 {
		if c.nlimits.Add(1) > maxSharedLimits {
			c.limits.Clear()
			c.nlimits.Store(0)
		}
		c.limits.Store(l, rl)
	}
	return rl
}

// envoyUnits are the units of current_limit, shortest first. Envoy's
// rate-limit filter writes a status's window in X-RateLimit-Limit as its
// unit's length alone (MONTH 30 days, YEAR 365 days), unit_multiplier
// left out.
var envoyUnits = [...]engine.Unit{engine.Second, engine.Minute, engine.Hour, engine.Day, engine.Week, engine.Month, engine.Year}

// currentLimitOf returns what current_limit says of l: requests_per_unit,
// unit and unit_multiplier, the limit's policy (service.Policy) in the
// protocol's terms.
//
// A limit whose policy window is its configured one (every limit but a
// token bucket whose burst fills in another time) is written as
// configured. A token bucket's policy, burst B per fill time T, is written
// B per the shortest unit not shorter than T, unit_multiplier 1: Envoy
// reads the unit alone, so a unit shorter than T (SECOND × 3 for 3 s)
// would make its X-RateLimit-Limit overstate the rate, while a longer one
// keeps B (≥ limit_remaining) and only understates it. A bucket that takes
// more than a year to fill is YEAR × its years, rounded up.
func currentLimitOf(l *config.Limit) (rpu uint32, unit engine.Unit, mult uint32) {
	r := l.Rule
	rpu = uint32(min(r.Capacity(), math.MaxUint32))
	// A calendar window's length is not a unit's: it is written as
	// configured (its quota window depends on the instant).
	if w := r.QuotaWindow(time.Time{}); r.Calendar != nil || w == r.Window {
		return rpu, r.Unit, r.Multiplier
	}
	w := r.QuotaWindow(time.Time{})
	for _, u := range envoyUnits {
		if u.Duration() >= w {
			return rpu, u, 1
		}
	}
	year := engine.Year.Duration()
	return rpu, engine.Year, uint32(min((w+year-1)/year, 1<<32-1))
}

func (c *converter) duration(d time.Duration) *durationpb.Duration {
	secs := service.CeilSeconds(d)
	if secs < 0 || secs > maxSharedDuration {
		return &durationpb.Duration{Seconds: secs}
	}
	if p := c.durations[secs].Load(); p != nil {
		return p
	}
	p := &durationpb.Duration{Seconds: secs}
	c.durations[secs].Store(p)
	return p
}

// protoResponse holds a response and the statuses of a small request in one
// allocation.
type protoResponse struct {
	resp     rlsv3.RateLimitResponse
	ptrs     [4]*rlsv3.RateLimitResponse_DescriptorStatus
	statuses [4]rlsv3.RateLimitResponse_DescriptorStatus
}

// toProto converts a service response. duration_until_reset is rounded up
// to whole seconds: Envoy truncates it to seconds for X-RateLimit-Reset and
// Retry-After, so a sub-second wait would otherwise read as 0.
func (c *converter) toProto(resp *service.Response) *rlsv3.RateLimitResponse {
	n := len(resp.Statuses)
	var out *rlsv3.RateLimitResponse
	var statuses []rlsv3.RateLimitResponse_DescriptorStatus
	if n <= len(protoResponse{}.ptrs) {
		pr := new(protoResponse)
		out, statuses = &pr.resp, pr.statuses[:n]
		out.Statuses = pr.ptrs[:n]
	} else {
		out = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
		statuses = make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	out.OverallCode = codeToProto[resp.Code]
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		ps := &statuses[i]
		ps.Code = codeToProto[st.Code]
		ps.LimitRemaining = st.Remaining
		if l := st.Limit; l != nil {
			ps.CurrentLimit = c.currentLimit(l)
			ps.DurationUntilReset = c.duration(st.ResetAfter)
		}
		out.Statuses[i] = ps
	}
	if len(resp.Headers) > 0 {
		out.ResponseHeadersToAdd = make([]*corev3.HeaderValue, len(resp.Headers))
		for i, h := range resp.Headers {
			out.ResponseHeadersToAdd[i] = &corev3.HeaderValue{Key: h.Key, Value: h.Value}
		}
	}
	if resp.Metadata != nil {
		// Values come from YAML as JSON-compatible ones, which NewStruct takes.
		out.DynamicMetadata, _ = structpb.NewStruct(resp.Metadata)
	}
	return out
}
