// Package envoyrls is the gRPC adapter of Envoy's RateLimitService v3: it
// converts RateLimitRequest to a service.Request and the service.Response
// back, and maps errors to gRPC codes. It holds no rate-limit logic.
package envoyrls

import (
	"context"
	"errors"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/descriptors"
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
	svc Checker
}

// New returns a server that asks svc.
func New(svc Checker) *Server { return &Server{svc: svc} }

// Register registers s on g.
func (s *Server) Register(g *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// ShouldRateLimit implements the RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	req := FromProto(in)
	resp, err := s.svc.ShouldRateLimit(ctx, req)
	if err != nil {
		return nil, Status(err)
	}
	return ToProto(resp), nil
}

// Status converts a service error to a gRPC status error.
func Status(err error) error {
	var inv *service.InvalidError
	switch {
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, inv.Error())
	case errors.Is(err, service.ErrStoreUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// FromProto converts a RateLimitRequest; the service validates it.
func FromProto(in *rlsv3.RateLimitRequest) *service.Request {
	req := &service.Request{
		Domain:      in.GetDomain(),
		HitsAddend:  in.GetHitsAddend(),
		Descriptors: make([]service.Descriptor, len(in.GetDescriptors())),
	}
	n := 0
	for _, d := range in.GetDescriptors() {
		n += len(d.GetEntries())
	}
	entries := make([]descriptors.Entry, n)
	for i, d := range in.GetDescriptors() {
		out := &req.Descriptors[i]
		es := entries[:len(d.GetEntries()):len(d.GetEntries())]
		entries = entries[len(d.GetEntries()):]
		for j, e := range d.GetEntries() {
			es[j] = descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()}
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
	return req
}

func unitFromProto(u typev3.RateLimitUnit) descriptors.Unit {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return descriptors.Second
	case typev3.RateLimitUnit_MINUTE:
		return descriptors.Minute
	case typev3.RateLimitUnit_HOUR:
		return descriptors.Hour
	case typev3.RateLimitUnit_DAY:
		return descriptors.Day
	case typev3.RateLimitUnit_MONTH:
		return descriptors.Month
	case typev3.RateLimitUnit_YEAR:
		return descriptors.Year
	}
	return descriptors.UnitUnknown
}

var unitToProto = [...]rlsv3.RateLimitResponse_RateLimit_Unit{
	descriptors.UnitUnknown: rlsv3.RateLimitResponse_RateLimit_UNKNOWN,
	descriptors.Second:      rlsv3.RateLimitResponse_RateLimit_SECOND,
	descriptors.Minute:      rlsv3.RateLimitResponse_RateLimit_MINUTE,
	descriptors.Hour:        rlsv3.RateLimitResponse_RateLimit_HOUR,
	descriptors.Day:         rlsv3.RateLimitResponse_RateLimit_DAY,
	descriptors.Week:        rlsv3.RateLimitResponse_RateLimit_WEEK,
	descriptors.Month:       rlsv3.RateLimitResponse_RateLimit_MONTH,
	descriptors.Year:        rlsv3.RateLimitResponse_RateLimit_YEAR,
}

var codeToProto = [...]rlsv3.RateLimitResponse_Code{
	service.OK:        rlsv3.RateLimitResponse_OK,
	service.OverLimit: rlsv3.RateLimitResponse_OVER_LIMIT,
}

// ToProto converts a service response. duration_until_reset is rounded up
// to whole seconds: Envoy truncates it to seconds for X-RateLimit-Reset and
// Retry-After, so a sub-second wait would otherwise read as 0.
func ToProto(resp *service.Response) *rlsv3.RateLimitResponse {
	out := &rlsv3.RateLimitResponse{
		OverallCode: codeToProto[resp.Code],
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(resp.Statuses)),
	}
	statuses := make([]rlsv3.RateLimitResponse_DescriptorStatus, len(resp.Statuses))
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		ps := &statuses[i]
		ps.Code = codeToProto[st.Code]
		ps.LimitRemaining = st.Remaining
		if l := st.Limit; l != nil {
			ps.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
				Name:            l.Name,
				RequestsPerUnit: l.RequestsPerUnit,
				Unit:            unitToProto[l.Unit],
			}
			if l.UnitMultiplier > 1 {
				ps.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
			}
			ps.DurationUntilReset = &durationpb.Duration{Seconds: int64((st.ResetAfter + time.Second - 1) / time.Second)}
		}
		out.Statuses[i] = ps
	}
	if len(resp.Headers) > 0 {
		out.ResponseHeadersToAdd = make([]*corev3.HeaderValue, len(resp.Headers))
		for i, h := range resp.Headers {
			out.ResponseHeadersToAdd[i] = &corev3.HeaderValue{Key: h.Key, Value: h.Value}
		}
	}
	return out
}
