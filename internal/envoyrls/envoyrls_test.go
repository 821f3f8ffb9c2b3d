package envoyrls

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

const limitsYAML = `
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: week, requests_per_unit: 100, name: weekly}
  - key: tenant
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 10}
  - key: vip
    rate_limit: {unlimited: true}
`

// newServer returns a server on limitsYAML, every request half a second into a
// second (so that a reset of 0.5 s reads as 1 s, rounded up).
func newServer(t testing.TB) *Server {
	t.Helper()
	now := storetest.NewClock(storetest.T0.Add(500 * time.Millisecond)).Now
	return New(servetest.Service(t, limitsYAML, service.Options{Store: servetest.MemoryStore(t, now)}))
}

func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestShouldRateLimit(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{
		desc("remote_address", "10.0.0.1"), desc("tenant", "t1"), desc("vip", "x"), desc("unknown", "y"),
	}}
	want := []*rlsv3.RateLimitResponse{
		{OverallCode: rlsv3.RateLimitResponse_OK},
		{OverallCode: rlsv3.RateLimitResponse_OK},
		{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT},
	}
	for i := range want {
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != want[i].OverallCode || len(resp.Statuses) != 4 {
			t.Fatalf("request %d: %v, want %s with 4 statuses", i, resp, want[i].OverallCode)
		}
		ip, tenant, vip, unknown := resp.Statuses[0], resp.Statuses[1], resp.Statuses[2], resp.Statuses[3]
		if i < 2 {
			if ip.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || ip.LimitRemaining != uint32(1-i) || ip.DurationUntilReset.GetSeconds() != 1 {
				t.Errorf("request %d: ip status %v, want 1/SECOND remaining %d reset 1s (0.5s rounded up)", i, ip, 1-i)
			}
		} else if ip.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("request %d: ip status %v, want OVER_LIMIT", i, ip)
		}
		if tenant.CurrentLimit.GetUnitMultiplier().GetValue() != 5 || tenant.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("request %d: tenant status %v, want 10 per 5 MINUTE", i, tenant)
		}
		if vip.Code != rlsv3.RateLimitResponse_OK || vip.CurrentLimit != nil || vip.LimitRemaining != math.MaxUint32 {
			t.Errorf("request %d: unlimited status %v", i, vip)
		}
		if unknown.Code != rlsv3.RateLimitResponse_OK || unknown.CurrentLimit != nil {
			t.Errorf("request %d: unmatched status %v", i, unknown)
		}
	}
	// The weekly limit is named and reported with its WEEK unit once it binds.
	resp, _ := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 0, Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: desc("remote_address", "10.0.0.9").Entries, HitsAddend: wrapperspb.UInt64(0)},
	}})
	if got := resp.Statuses[0].CurrentLimit; got.GetRequestsPerUnit() != 2 {
		t.Errorf("look-only status limit %v, want the per-second limit (least remaining, 2 of 2 vs 100 of 100)", got)
	}
}

func TestOverrideAndErrors(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	d := desc("tenant", "t9")
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{d}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != want || resp.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Fatalf("override request %d: %v %v, want %s with 1/HOUR", i, resp, err, want)
		}
	}
	d.Limit.Unit = typev3.RateLimitUnit_UNKNOWN
	if _, err := s.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
		t.Errorf("override without a unit: %v, want InvalidArgument (the reference crashes here)", err)
	}
	huge := desc("tenant", "t9")
	huge.HitsAddend = wrapperspb.UInt64(1 << 63)
	if _, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{huge}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("hits_addend 2^63: %v, want InvalidArgument", err)
	}
}

// TestPooledRequestsDoNotLeak sends requests of different shapes one after
// the other through the pooled conversion.
func TestPooledRequestsDoNotLeak(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	for i := range 50 {
		var ds []*commonv3.RateLimitDescriptor
		for j := range i%5 + 1 {
			ds = append(ds, desc("remote_address", fmt.Sprintf("10.1.%d.%d", i, j)))
		}
		resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: ds})
		if err != nil || len(resp.Statuses) != len(ds) {
			t.Fatalf("request %d with %d descriptors: %v %v", i, len(ds), resp, err)
		}
		for j, st := range resp.Statuses {
			if st.LimitRemaining != 1 {
				t.Errorf("request %d status %d: remaining %d, want 1 (a fresh address)", i, j, st.LimitRemaining)
			}
		}
	}
}

func BenchmarkHandler(b *testing.B) {
	s := newServer(b)
	in := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc("tenant", "t1")}}
	ctx := context.Background()
	// Lift the limit so every request is admitted.
	in.Descriptors[0].Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: math.MaxUint32, Unit: typev3.RateLimitUnit_SECOND}
	wire, _ := proto.Marshal(in)
	b.Run("rls", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req rlsv3.RateLimitRequest
			proto.Unmarshal(wire, &req)
			resp, _ := s.ShouldRateLimit(ctx, &req)
			proto.Marshal(resp)
		}
	})
	static := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	b.Run("ceiling", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req rlsv3.RateLimitRequest
			proto.Unmarshal(wire, &req)
			proto.Marshal(static)
		}
	})
}

// bench3x2Server serves the load harness's second shape: three descriptors
// of two windows each, limits that admit everything.
func bench3x2Server(b *testing.B) *Server {
	return New(servetest.Service(b, `
domain: bench
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 1000000, algorithm: token_bucket, burst: 1000000}
      - {unit: day, requests_per_unit: 1000000000}
  - key: path
    rate_limits:
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000}
  - key: tenant
    rate_limits:
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
`, service.Options{Store: servetest.MemoryStore(b, time.Now), Observers: []service.Observer{decisionmetrics.New(prometheus.NewRegistry(), decisionmetrics.Options{})}}))
}

// BenchmarkHandler3x2 is the load harness's second shape in process.
func BenchmarkHandler3x2(b *testing.B) {
	s := bench3x2Server(b)
	var wires [][]byte
	for i := range 1000 {
		in := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{
			desc("api_key", fmt.Sprintf("key-%d", i%997)), desc("path", fmt.Sprintf("/api/v1/items/%d", i%101)), desc("tenant", fmt.Sprintf("tenant-%d", i%13)),
		}}
		w, _ := proto.Marshal(in)
		wires = append(wires, w)
	}
	ctx := context.Background()
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		var req rlsv3.RateLimitRequest
		proto.Unmarshal(wires[i%len(wires)], &req)
		i++
		resp, _ := s.ShouldRateLimit(ctx, &req)
		proto.Marshal(resp)
	}
}

func BenchmarkHandler3x2Parallel(b *testing.B) {
	s := bench3x2Server(b)
	var reqs []*rlsv3.RateLimitRequest
	for i := range 1000 {
		reqs = append(reqs, &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{
			desc("api_key", fmt.Sprintf("key-%d", i%997)), desc("path", fmt.Sprintf("/api/v1/items/%d", i%101)), desc("tenant", fmt.Sprintf("tenant-%d", i%13)),
		}})
	}
	ctx := context.Background()
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.ShouldRateLimit(ctx, reqs[int(next.Add(1))%len(reqs)])
		}
	})
}
