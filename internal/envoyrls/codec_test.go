package envoyrls

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/servetest"
)

// requestWithValue returns a marshaled RateLimitRequest of domain api with
// one remote_address descriptor whose value is v, whatever its bytes (the
// Go protobuf encoder would refuse to write a string that is not UTF-8).
func requestWithValue(t testing.TB, v string) []byte {
	t.Helper()
	placeholder := strings.Repeat("\x01", len(v))
	b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", placeholder)}})
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Replace(b, []byte(placeholder), []byte(v), 1)
}

func TestDecodeRequestNotUTF8(t *testing.T) {
	b := requestWithValue(t, "caf\xe9-\xff")
	if err := proto.Unmarshal(b, &rlsv3.RateLimitRequest{}); err == nil || !strings.Contains(err.Error(), "invalid UTF-8") {
		t.Fatalf("the premise: Go's protobuf refuses the request with an UTF-8 error, got %v", err)
	}
	var got rlsv3.RateLimitRequest
	if err := decodeRequest(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Domain != "api" || len(got.Descriptors) != 1 || got.Descriptors[0].Entries[0].Value != "caf\xe9-\xff" {
		t.Errorf("decoded %q", got.String())
	}
}

// rawMsg and rawCodec let a test client send bytes that the Go protobuf
// encoder would refuse to produce.
type rawMsg []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*rawMsg))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// TestNotUTF8OverGRPC: a descriptor value that is not UTF-8 (Envoy copies
// header bytes as they are) is limited like any other, over a real gRPC
// connection; without the codec the request fails with INTERNAL.
func TestNotUTF8OverGRPC(t *testing.T) {
	call := func(opts ...grpc.ServerOption) func(b []byte) (*rlsv3.RateLimitResponse, error) {
		cc := servetest.GRPC(t, newServer(t).Register, opts...)
		return func(b []byte) (*rlsv3.RateLimitResponse, error) {
			var resp rlsv3.RateLimitResponse
			msg := rawMsg(b)
			err := cc.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &msg, &resp, grpc.ForceCodecV2(rawCodec{}))
			return &resp, err
		}
	}

	plain := call()
	if _, err := plain(requestWithValue(t, "\xff")); status.Code(err) != codes.Internal {
		t.Fatalf("the premise: without the codec the request fails with INTERNAL, got %v", err)
	}

	rls := call(ServerCodec())
	a, b := requestWithValue(t, "10.0.0.\xff"), requestWithValue(t, "10.0.0.\xfe")
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i, step := range []struct {
		req  []byte
		want rlsv3.RateLimitResponse_Code
	}{{a, ok}, {a, ok}, {a, over}, {b, ok}} { // 2 per second per address
		resp, err := rls(step.req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.OverallCode != step.want || len(resp.Statuses) != 1 {
			t.Errorf("request %d: %v, want %v with one status", i, resp, step.want)
		}
	}
}

// FuzzDecodeRequest: wherever Go's protobuf decodes a RateLimitRequest,
// decodeRequest decodes the same (unknown fields aside).
func FuzzDecodeRequest(f *testing.F) {
	full := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 3, Descriptors: []*commonv3.RateLimitDescriptor{
		{
			Entries:        []*commonv3.RateLimitDescriptor_Entry{{Key: "a", Value: "1"}, {Key: "b"}},
			Limit:          &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(4)},
			HitsAddend:     wrapperspb.UInt64(1 << 40),
			IsNegativeHits: true,
		},
		desc("remote_address", "10.0.0.1"),
	}}
	b, err := proto.Marshal(full)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(append(b, b...)) // every field twice: repeated ones append, messages merge
	f.Add([]byte{})
	f.Add([]byte("\x12\x00\x1a\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got rlsv3.RateLimitRequest
		if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &want); err != nil {
			return
		}
		if err := decodeRequest(b, &got); err != nil {
			t.Fatalf("decodeRequest: %v; proto.Unmarshal decoded %v", err, &want)
		}
		if !proto.Equal(&want, &got) {
			t.Fatalf("decodeRequest:\n%v\nproto.Unmarshal:\n%v", fmt.Sprint(&got), fmt.Sprint(&want))
		}
	})
}
