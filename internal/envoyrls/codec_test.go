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
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rlsproject/rls/internal/grpcserver"
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

// manyDescriptors returns a marshaled request of domain api with n
// descriptors of one entry each, whose marshaled form is entry.
func manyDescriptors(n int, entry string) []byte {
	var d, b []byte
	d = protowire.AppendTag(d, 1, protowire.BytesType)
	d = protowire.AppendBytes(d, []byte(entry))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("api"))
	for range n {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	return b
}

// kv is the marshaled entry k=v; the hostile requests use empty entries
// (4 bytes a descriptor: 262,000 of them in 1 MiB).
const kv = "\x0a\x01k\x12\x01v"

// manyEntries returns a marshaled request of domain api with one
// descriptor of n entries (k=v).
func manyEntries(n int) []byte {
	var d, b []byte
	for range n {
		d = protowire.AppendTag(d, 1, protowire.BytesType)
		d = protowire.AppendBytes(d, []byte("\x0a\x01k\x12\x01v"))
	}
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("api"))
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendBytes(b, d)
}

// TestShapeCheckedWhileDecoding: a request of more descriptors or entries
// than the service allows is refused with the service's own message, and
// nothing of it is built: a ~1 MiB request of 262,000 descriptors costs a
// scan, not 262,000 descriptors.
func TestShapeCheckedWhileDecoding(t *testing.T) {
	s := newServer(t)
	for _, tc := range []struct {
		name string
		wire []byte
		want string
	}{
		{"100 descriptors", manyDescriptors(100, kv), "descriptors: 100 descriptors, at most 64 allowed"},
		{"100 entries", manyEntries(100), "descriptors[0].entries: 100 entries, at most 16 allowed"},
	} {
		var m rlsv3.RateLimitRequest
		err := decodeWire(tc.wire, &m)
		if err == nil || err.Error() != tc.want || len(m.Descriptors) != 0 {
			t.Errorf("%s: decodeWire = %v with %d descriptors built, want %q and none", tc.name, err, len(m.Descriptors), tc.want)
		}
		// The service, given the whole request, says the same.
		var full rlsv3.RateLimitRequest
		if err := proto.Unmarshal(tc.wire, &full); err != nil {
			t.Fatal(err)
		}
		if _, err := s.decide(context.Background(), &full); err == nil || err.Error() != tc.want {
			t.Errorf("%s: the service says %v, want %q", tc.name, err, tc.want)
		}
	}
	huge := manyDescriptors(262_000, "")
	if len(huge) < 1_000_000 || len(huge) > 1<<20 {
		t.Fatalf("the hostile request is %d bytes, want about 1 MiB", len(huge))
	}
	allocs := testing.AllocsPerRun(3, func() {
		if err := decodeWire(huge, &rlsv3.RateLimitRequest{}); err == nil {
			t.Fatal("a request of 262,000 descriptors decoded")
		}
	})
	if allocs > 8 {
		t.Errorf("refusing a request of 262,000 descriptors made %v allocations, want a handful (nothing per descriptor)", allocs)
	}
}

// TestMalformedRequestIsInvalidArgument: bytes that are not a
// RateLimitRequest are the client's error, not the server's.
func TestMalformedRequestIsInvalidArgument(t *testing.T) {
	var m rlsv3.RateLimitRequest
	err := decodeWire([]byte("\x12\xff\xff\xff"), &m) // a descriptor longer than the message
	if err == nil || status.Code(grpcStatus(err)) != codes.InvalidArgument {
		t.Errorf("decodeWire(truncated) = %v, want an InvalidArgument error", err)
	}
}

// TestHostileRequestsOverGRPC: ~1 MiB requests of 262,000 descriptors over
// a real connection are each refused with InvalidArgument, and a normal
// client is served meanwhile.
func TestHostileRequestsOverGRPC(t *testing.T) {
	cc := servetest.GRPC(t, newServer(t).Register, append(grpcserver.Options(grpcserver.Limits{}), ServerCodec())...)
	huge := rawMsg(manyDescriptors(262_000, ""))
	client := rlsv3.NewRateLimitServiceClient(cc)
	for i := range 5 {
		var resp rlsv3.RateLimitResponse
		err := cc.Invoke(context.Background(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &huge, &resp, grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "262000 descriptors, at most 64 allowed") {
			t.Errorf("hostile request %d: %v, want InvalidArgument naming the bound", i, err)
		}
		resp2, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", fmt.Sprint("10.9.0.", i))}})
		if err != nil || resp2.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("normal request %d among hostile ones: %v %v, want OK", i, resp2, err)
		}
	}
}

// FuzzCheckShape: whatever checkShape refuses, the service refuses too; what
// it lets through decodes as Go's protobuf decodes it.
func FuzzCheckShape(f *testing.F) {
	s := newServer(f)
	f.Add(manyDescriptors(1, kv))
	f.Add(manyDescriptors(65, kv))
	f.Add(manyEntries(17))
	f.Add([]byte("\x0a\x00\x12\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var want rlsv3.RateLimitRequest
		if err := proto.Unmarshal(b, &want); err != nil {
			return
		}
		var got rlsv3.RateLimitRequest
		if err := decodeWire(b, &got); err != nil {
			if _, serr := s.decide(context.Background(), &want); serr == nil {
				t.Fatalf("decodeWire refused %v (%v), the service accepts it", &want, err)
			}
			return
		}
		if !proto.Equal(&want, &got) {
			t.Fatalf("decodeWire:\n%v\nproto.Unmarshal:\n%v", &got, &want)
		}
	})
}

// BenchmarkRefuseHostile: refusing the ~1 MiB request of 262,000
// descriptors by a scan (rls's codec) and by decoding it whole first (what
// Go's protobuf codec and the service's own check did before).
func BenchmarkRefuseHostile(b *testing.B) {
	huge := manyDescriptors(262_000, "")
	s := newServer(b)
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decodeWire(huge, &rlsv3.RateLimitRequest{})
		}
	})
	b.Run("decode-whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m rlsv3.RateLimitRequest
			proto.Unmarshal(huge, &m)
			s.decide(context.Background(), &m)
		}
	})
}
