package grpcserver

import (
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestCodecRoundTrip(t *testing.T) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:               rlsv3.RateLimitResponse_OVER_LIMIT,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "n", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_WEEK},
			LimitRemaining:     3,
			DurationUntilReset: &durationpb.Duration{Seconds: 42},
		}},
	}
	big := &rlsv3.RateLimitRequest{Domain: strings.Repeat("d", 100_000), Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	for _, tc := range []struct {
		in, out proto.Message
	}{
		{resp, &rlsv3.RateLimitResponse{}}, // vtprotobuf, small
		{big, &rlsv3.RateLimitRequest{}},   // vtprotobuf, pooled buffer
		{&grpc_health_v1.HealthCheckRequest{Service: "x"}, &grpc_health_v1.HealthCheckRequest{}}, // no vtprotobuf
	} {
		data, err := codec{}.Marshal(tc.in)
		if err != nil {
			t.Fatalf("Marshal(%T): %v", tc.in, err)
		}
		want, _ := proto.Marshal(tc.in)
		if got := data.Materialize(); string(got) != string(want) {
			t.Errorf("Marshal(%T) differs from proto.Marshal", tc.in)
		}
		if err := (codec{}).Unmarshal(data, tc.out); err != nil {
			t.Fatalf("Unmarshal(%T): %v", tc.out, err)
		}
		data.Free()
		if !proto.Equal(tc.in, tc.out) {
			t.Errorf("round trip of %T: got %v, want %v", tc.in, tc.out, tc.in)
		}
	}
	if _, err := (codec{}).Marshal(42); err == nil {
		t.Error("Marshal(42) succeeded")
	}
}
