// Package xdsconfig receives rate-limit configs from an xDS management
// server: an ADS state-of-the-world client for RateLimitConfig resources
// (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig), as
// envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW and Envoy Gateway use.
// It hands each config set to a Target, ACKs what the Target loads and NACKs
// what it refuses, and reconnects with backoff. It knows nothing about
// descriptors, the service or how a config is validated.
package xdsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// TypeURL is the resource type the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Target takes the configs the client receives: every RateLimitConfig of
// one response, the whole state. Load makes them current and returns nil,
// or returns why it refused them (the old config then stays in use): the
// error's text goes back to the server in the NACK's error_detail. Load is
// called from the client's goroutine only.
type Target interface {
	Load(version string, configs []*rlsconfv3.RateLimitConfig) error
}

// Backoff spaces connection attempts: Initial, doubled after every failed
// attempt up to Max; each wait is spread by ±RandomFactor when Jitter is
// set. It also spaces the NACKs of a config the server sends again after
// it was refused.
type Backoff struct {
	Initial, Max time.Duration
	RandomFactor float64
	Jitter       bool
}

// DefaultBackoff is envoyproxy/ratelimit's (XDS_CLIENT_BACKOFF_*).
var DefaultBackoff = Backoff{Initial: 10 * time.Second, Max: 60 * time.Second, RandomFactor: 0.5, Jitter: true}

// Options configure a Client.
type Options struct {
	// Server is the management server's address (host:port, or any gRPC
	// target).
	Server string
	// NodeID and NodeMetadata identify this client to the server (the
	// snapshot cache keys its snapshots by node id).
	NodeID       string
	NodeMetadata *structpb.Struct
	// Headers are sent as gRPC metadata on the stream.
	Headers map[string]string
	// TLS, when not nil, secures the connection (with a client
	// certificate for mutual TLS); nil is plaintext.
	TLS *tls.Config
	// Backoff between attempts; the zero value means DefaultBackoff.
	Backoff Backoff
	// MaxMsgSize bounds a received message (0: gRPC's default, 4 MiB).
	MaxMsgSize int
	// Keepalive pings the server on a connection that has been silent
	// that long, and drops the connection when the ping is not answered in
	// time (a half-open connection, or a proxy that stopped forwarding);
	// the client then reconnects. The zero value means DefaultKeepalive.
	Keepalive Keepalive
	Logger    *slog.Logger
}

// Keepalive is the client's gRPC keepalive: a ping after Time without
// anything received (gRPC raises it to 10 s at least), the connection
// closed when its answer has not come Timeout later.
type Keepalive struct {
	Time, Timeout time.Duration
}

// DefaultKeepalive pings every 5 minutes 30 seconds of silence, at most:
// grpc-go's servers refuse pings closer than 5 minutes unless configured
// otherwise (their EnforcementPolicy's default MinTime; after three such
// pings on a stream that sends nothing they answer GOAWAY too_many_pings),
// and Envoy Gateway's rate-limit xDS server keeps that default; the 30
// seconds absorb delays in handling a ping. go-control-plane's example
// server allows 30 seconds. Pings are sent only while the stream is open
// (a default server counts pings without a stream as abuse).
var DefaultKeepalive = Keepalive{Time: 5*time.Minute + 30*time.Second, Timeout: 20 * time.Second}

// Client is an ADS state-of-the-world client. Run owns it; it is not for
// concurrent use.
type Client struct {
	o      Options
	target Target
	log    *slog.Logger

	acked string // version_info of the last config loaded
	// refused* are the last config refused, to recognise it when the server
	// sends it again (go-control-plane's snapshot cache answers a NACK with
	// the same version at once).
	refusedVersion string
	refusedMsg     string
	refused        []byte
	refusals       int // consecutive refusals of the same config
}

// New returns a client that loads what it receives into target.
func New(o Options, target Target) *Client {
	if o.Backoff == (Backoff{}) {
		o.Backoff = DefaultBackoff
	}
	if o.Keepalive == (Keepalive{}) {
		o.Keepalive = DefaultKeepalive
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Client{o: o, target: target, log: o.Logger.With("xds_server", o.Server)}
}

// Run connects to the server and follows its configs until ctx is done,
// reconnecting with backoff whenever the stream ends. It returns nil when
// ctx is done, or an error when the client cannot be set up at all.
func (c *Client) Run(ctx context.Context) error {
	creds := insecure.NewCredentials()
	if c.o.TLS != nil {
		creds = credentials.NewTLS(c.o.TLS)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: c.o.Keepalive.Time, Timeout: c.o.Keepalive.Timeout}),
	}
	if c.o.MaxMsgSize > 0 {
		dopts = append(dopts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.o.MaxMsgSize)))
	}
	conn, err := grpc.NewClient(c.o.Server, dopts...)
	if err != nil {
		return fmt.Errorf("xDS server %q: %w", c.o.Server, err)
	}
	defer conn.Close()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	if len(c.o.Headers) > 0 {
		kv := make([]string, 0, 2*len(c.o.Headers))
		for k, v := range c.o.Headers {
			kv = append(kv, k, v)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	failures := 0
	for {
		received, err := c.stream(ctx, ads)
		if ctx.Err() != nil {
			return nil
		}
		if received {
			failures = 0
		}
		wait := c.o.Backoff.wait(failures)
		failures++
		c.log.Warn("xDS stream ended; reconnecting", "error", err, "in", wait.Round(time.Millisecond))
		if !sleep(ctx, wait) {
			return nil
		}
	}
}

// stream runs one ADS stream until it fails; received says whether a
// response came on it.
func (c *Client) stream(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) (received bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := ads.StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	node := &corev3.Node{Id: c.o.NodeID, Metadata: c.o.NodeMetadata, UserAgentName: "rls"}
	// The first request names the node and the last version loaded, so
	// that a server that still has it sends nothing new.
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: c.acked}); err != nil {
		return false, err
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the server closed the stream")
			}
			return received, err
		}
		if !received {
			c.log.Info("xDS stream established", "node", c.o.NodeID)
		}
		received = true
		if resp.GetTypeUrl() != TypeURL {
			c.log.Warn("xDS response of an unexpected type ignored", "type", resp.GetTypeUrl())
			continue
		}
		req, wait := c.answer(resp)
		req.Node = node
		if wait > 0 && !sleep(ctx, wait) {
			return received, ctx.Err()
		}
		if err := s.Send(req); err != nil {
			return received, err
		}
	}
}

// answer loads resp into the target and returns the ACK or NACK to send,
// and how long to wait before sending it (a config refused again).
func (c *Client) answer(resp *discoveryv3.DiscoveryResponse) (*discoveryv3.DiscoveryRequest, time.Duration) {
	raw := marshalResources(resp)
	if c.refused != nil && resp.GetVersionInfo() == c.refusedVersion && string(raw) == string(c.refused) {
		// The server sent the refused config again, as a snapshot cache
		// does at once: refuse it again without another load or log line,
		// spaced by the backoff so that neither side spins.
		wait := c.o.Backoff.wait(c.refusals - 1)
		c.refusals++
		return c.nack(resp, c.refusedMsg), wait
	}
	configs, err := decode(resp)
	if err == nil {
		err = c.target.Load(resp.GetVersionInfo(), configs)
	}
	if err != nil {
		c.refusedVersion, c.refusedMsg, c.refused, c.refusals = resp.GetVersionInfo(), err.Error(), raw, 1
		c.log.Error("xDS config refused (NACK); the previous config stays in use", "version", resp.GetVersionInfo(), "error", err)
		return c.nack(resp, err.Error()), 0
	}
	c.refused, c.refusedVersion, c.refusedMsg, c.refusals = nil, "", "", 0
	c.acked = resp.GetVersionInfo()
	c.log.Info("xDS config loaded (ACK)", "version", c.acked, "resources", len(configs))
	return &discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, VersionInfo: c.acked, ResponseNonce: resp.GetNonce()}, 0
}

func (c *Client) nack(resp *discoveryv3.DiscoveryResponse, msg string) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{
		TypeUrl:       TypeURL,
		VersionInfo:   c.acked,
		ResponseNonce: resp.GetNonce(),
		ErrorDetail:   &statuspb.Status{Code: int32(codes.InvalidArgument), Message: msg},
	}
}

// decode unpacks the resources of resp.
func decode(resp *discoveryv3.DiscoveryResponse) ([]*rlsconfv3.RateLimitConfig, error) {
	out := make([]*rlsconfv3.RateLimitConfig, 0, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		if a.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resource %d is a %s, not a RateLimitConfig", i, a.GetTypeUrl())
		}
		rc := &rlsconfv3.RateLimitConfig{}
		if err := a.UnmarshalTo(rc); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		out = append(out, rc)
	}
	return out, nil
}

// marshalResources is the resources of resp as bytes, to compare two
// responses.
func marshalResources(resp *discoveryv3.DiscoveryResponse) []byte {
	var b []byte
	for _, a := range resp.GetResources() {
		m, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a)
		b = fmt.Appendf(b, "%d:", len(m))
		b = append(b, m...)
	}
	return b
}

// wait returns the backoff after n failed attempts (n ≥ 0).
func (b Backoff) wait(n int) time.Duration {
	d := b.Initial
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if b.Jitter && b.RandomFactor > 0 {
		spread := float64(d) * b.RandomFactor
		d = time.Duration(float64(d) - spread + rand.Float64()*2*spread)
	}
	return max(d, 0)
}

// sleep waits d or until ctx is done; false when ctx is done.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
