package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rawCodec sends bytes as they are, to put malformed messages on the wire.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(proto.Message); ok {
		return proto.Unmarshal(data.Materialize(), m)
	}
	return nil
}

var _ encoding.CodecV2 = rawCodec{}

func TestHostileInput(t *testing.T) {
	s := startServer(t, nil, "--config", "../../config/limits.yaml")
	cc := s.dial(t)
	rl := rlsv3.NewRateLimitServiceClient(cc)
	ctx := context.Background()

	// A value that is not UTF-8 (Envoy copies header bytes as they are), which
	// Go's protobuf decoder refuses: decoded all the same and limited.
	var entry, descriptor, msg []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendBytes(entry, []byte("remote_address"))
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendBytes(entry, []byte("198.51.100.\xff"))
	descriptor = protowire.AppendTag(descriptor, 1, protowire.BytesType)
	descriptor = protowire.AppendBytes(descriptor, entry)
	msg = protowire.AppendTag(msg, 1, protowire.BytesType)
	msg = protowire.AppendBytes(msg, []byte("api"))
	msg = protowire.AppendTag(msg, 2, protowire.BytesType)
	msg = protowire.AppendBytes(msg, descriptor)
	var out rlsv3.RateLimitResponse
	err := cc.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &msg, &out, grpc.ForceCodecV2(rawCodec{}))
	if err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK || len(out.Statuses) != 1 || out.Statuses[0].CurrentLimit == nil {
		t.Errorf("a value that is not UTF-8: %v %v, want OK under the remote_address limit", &out, err)
	}
	// A message over the 1 MiB bound.
	big := rlRequest("api", "k", strings.Repeat("x", 2<<20))
	if _, err := rl.ShouldRateLimit(ctx, big); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a 2 MiB request: %v, want ResourceExhausted", err)
	}
	many := &rlsv3.RateLimitRequest{Domain: "api"}
	for i := range 65 {
		many.Descriptors = append(many.Descriptors, rlRequest("api", "remote_address", fmt.Sprint(i)).Descriptors[0])
	}
	deep := rlRequest("api")
	for i := range 17 {
		deep.Descriptors[0].Entries = append(deep.Descriptors[0].Entries, &commonv3.RateLimitDescriptor_Entry{Key: fmt.Sprint("k", i), Value: "v"})
	}
	hits := rlRequest("api", "remote_address", "1.2.3.4")
	hits.Descriptors[0].HitsAddend = wrapperspb.UInt64(1 << 63)
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"65 descriptors": many, "17 entries": deep, "hits 2^63": hits,
		"a 5000-byte value": rlRequest("api", "remote_address", strings.Repeat("v", 5000)),
	} {
		if _, err := rl.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	// Regression test for the reference's counter collision: ("a_b","c") and
	// ("a","b_c") share the counter d_a_b_c there. Here each admits its own hit.
	dir := t.TempDir()
	cfg := writeFile(t, dir, "d.yaml", "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	d := rlsv3.NewRateLimitServiceClient(startServer(t, nil, "--config", cfg).dial(t))
	for _, req := range []*rlsv3.RateLimitRequest{rlRequest("d", "a_b", "c"), rlRequest("d", "a", "b_c")} {
		resp, err := d.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("%v: %v %v, want OK: the two descriptors must not share a counter", req.Descriptors[0].Entries, resp.GetOverallCode(), err)
		}
	}
	// A wildcard matches the value only: path_/api/v1/x is not path + /api/v1/*.
	resp, err := rl.ShouldRateLimit(ctx, rlRequest("api", "path_/api/v1/x", "z"))
	if err != nil || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("key path_/api/v1/x matched a limit: %v %v", resp, err)
	}
	// The server is still fine.
	if _, err := rl.ShouldRateLimit(ctx, rlRequest("api", "remote_address", "9.9.9.9")); err != nil {
		t.Errorf("after the hostile requests: %v", err)
	}
}

// TestSlowHTTPClientsLeaveRoom: more stalled /json requests than
// --http-max-connections (the attack that once took every file descriptor:
// /json bodies trickled over 1,100 connections). The HTTP listener stays
// within its bound, closing the stalled connections to make room, and
// normal /auth and gRPC requests are all answered meanwhile.
func TestSlowHTTPClientsLeaveRoom(t *testing.T) {
	const max, slow = 16, 64
	s := startServer(t, nil, "--config", "../../config/limits.yaml", "--http-max-connections", fmt.Sprint(max))
	for range slow {
		c, err := net.Dial("tcp", s.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /json HTTP/1.1\r\nHost: rls\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"domain\":")
	}
	s.waitUntil(t, "every stalled connection accepted", func() bool {
		evicted, _ := strconv.Atoi(metricValue(t, s.httpAddr, "rls_http_connections_evicted_total"))
		return evicted >= slow-max
	})
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	for i := range 5 {
		req, _ := http.NewRequest("GET", "http://"+s.httpAddr+"/auth/api", nil)
		req.Header.Set("X-Real-IP", fmt.Sprint("198.51.100.", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("/auth %d with %d stalled /json requests: %v", i, slow, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("/auth %d with %d stalled /json requests: %d, want 200", i, slow, resp.StatusCode)
		}
		if _, err := rl.ShouldRateLimit(context.Background(), rlRequest("api", "remote_address", fmt.Sprint("198.51.100.", i))); err != nil {
			t.Errorf("gRPC request %d with %d stalled /json requests: %v", i, slow, err)
		}
	}
	if n, _ := strconv.Atoi(metricValue(t, s.httpAddr, "rls_http_connections")); n > max {
		t.Errorf("rls_http_connections = %d, want at most --http-max-connections %d", n, max)
	}
}
