package grpcserver

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rlsproject/rls/internal/servetest"
)

// rawConn is a hand-driven HTTP/2 client connection, to send what no gRPC
// client would.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	fr *http2.Framer
}

// dialRaw opens an HTTP/2 connection to addr and returns it with the
// server's SETTINGS frame.
func dialRaw(t *testing.T, addr string) (*rawConn, *http2.SettingsFrame) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A guard against a hung test, not a measure: every read below expects
	// a frame the server sends at once.
	c.SetDeadline(time.Now().Add(30 * time.Second))
	r := &rawConn{t: t, c: c, fr: http2.NewFramer(c, c)}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f := r.next()
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			if err := r.fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			return r, sf
		}
	}
}

func (r *rawConn) next() http2.Frame {
	r.t.Helper()
	f, err := r.fr.ReadFrame()
	if err != nil {
		r.t.Fatalf("reading a frame: %v", err)
	}
	return f
}

// openStream sends the HEADERS of a gRPC call of method on stream id, and
// never its message.
func (r *rawConn) openStream(id uint32, method string) {
	r.t.Helper()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, kv := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "rls"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		r.t.Fatal(err)
	}
}

// serveHealth serves the gRPC health service with Options(l) and returns
// its address and a client of it.
func serveHealth(t *testing.T, l Limits) (string, healthpb.HealthClient) {
	t.Helper()
	cc := servetest.GRPC(t, func(gs *grpc.Server) {
		healthpb.RegisterHealthServer(gs, health.NewServer())
	}, Options(l)...)
	return cc.Target(), healthpb.NewHealthClient(cc)
}

// TestMaxStreams: a connection that opens streams and never sends their
// messages holds at most MaxStreams of them; the others are refused at
// once, and other clients are served meanwhile.
func TestMaxStreams(t *testing.T) {
	const maxStreams, opened = 4, 40
	addr, client := serveHealth(t, Limits{MaxStreams: maxStreams})
	r, settings := dialRaw(t, addr)
	if v, ok := settings.Value(http2.SettingMaxConcurrentStreams); !ok || v != maxStreams {
		t.Fatalf("server SETTINGS_MAX_CONCURRENT_STREAMS = %d (sent: %v), want %d", v, ok, maxStreams)
	}
	for i := range opened {
		r.openStream(uint32(2*i+1), "/grpc.health.v1.Health/Check")
	}
	refused := 0
	for refused < opened-maxStreams {
		f := r.next()
		rst, ok := f.(*http2.RSTStreamFrame)
		if !ok {
			continue
		}
		if rst.ErrCode != http2.ErrCodeRefusedStream || rst.StreamID <= 2*maxStreams {
			t.Fatalf("RST_STREAM %v on stream %d; want REFUSED_STREAM on streams after the first %d", rst.ErrCode, rst.StreamID, maxStreams)
		}
		refused++
	}
	for i := range 3 {
		resp, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health check %d while the hostile connection holds %d streams: %v %v, want SERVING", i, maxStreams, resp, err)
		}
	}
}

// TestPingFlood: a client that pings more often than the enforcement
// policy allows is sent GOAWAY (ENHANCE_YOUR_CALM) and its connection ends.
func TestPingFlood(t *testing.T) {
	addr, client := serveHealth(t, Limits{})
	r, _ := dialRaw(t, addr)
	for i := range 10 {
		if err := r.fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			break // the server may already have closed the connection
		}
	}
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("the connection ended (%v) without a GOAWAY", err)
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			if ga.ErrCode != http2.ErrCodeEnhanceYourCalm {
				t.Errorf("GOAWAY %v, want ENHANCE_YOUR_CALM", ga.ErrCode)
			}
			break
		}
	}
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check after another client's ping flood: %v", err)
	}
}

// TestMaxConnectionAge: a connection older than MaxConnectionAge is sent
// GOAWAY; the client (here a raw one) is told to go elsewhere.
func TestMaxConnectionAge(t *testing.T) {
	addr, _ := serveHealth(t, Limits{MaxConnectionAge: 50 * time.Millisecond, MaxConnectionAgeGrace: time.Minute})
	r, _ := dialRaw(t, addr)
	for {
		if ga, ok := r.next().(*http2.GoAwayFrame); ok {
			if ga.ErrCode != http2.ErrCodeNo {
				t.Errorf("GOAWAY %v, want NO_ERROR (a graceful one)", ga.ErrCode)
			}
			return
		}
	}
}
