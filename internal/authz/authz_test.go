package authz

import (
	"context"
	"net/netip"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

const config = `
domain: web
http_descriptors:
  - actions: [{remote_address: {}}]
  - actions:
      - header_value_match: {descriptor_value: post, headers: [{name: ":method", string_match: {exact: POST}}]}
      - request_headers: {header_name: ":path", descriptor_key: path}
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: header_match
    value: post
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 1}
`

func newServer(t *testing.T, trusted ...string) *Server {
	t.Helper()
	cfg, err := descriptors.Parse("web.yaml", []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	ms := memstore.New(memstore.Options{Now: storetest.NewClock(storetest.T0).Now})
	t.Cleanup(func() { ms.Close() })
	svc := service.New(service.Options{Store: ms})
	svc.SetConfig(cfg)
	var prefixes []netip.Prefix
	for _, p := range trusted {
		prefixes = append(prefixes, netip.MustParsePrefix(p))
	}
	return New(svc, prefixes)
}

func checkRequest(domain, peer, method, path string, headers map[string]string) *authv3.CheckRequest {
	h := map[string]string{":method": method, ":path": path, ":authority": "example.com"}
	for k, v := range headers {
		h[k] = v
	}
	ext := map[string]string{}
	if domain != "" {
		ext["domain"] = domain
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: peer, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: method, Path: path, Host: "example.com", Headers: h,
		}},
		ContextExtensions: ext,
	}}
}

func headerMap(opts []*corev3.HeaderValueOption) map[string]string {
	m := map[string]string{}
	for _, o := range opts {
		m[o.GetHeader().GetKey()] = o.GetHeader().GetValue()
	}
	return m
}

func TestCheck(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	for i := range 2 {
		resp, err := s.Check(ctx, checkRequest("web", "192.0.2.1", "GET", "/a", nil))
		if err != nil {
			t.Fatal(err)
		}
		ok := resp.GetOkResponse()
		if resp.GetStatus().GetCode() != 0 || ok == nil {
			t.Fatalf("request %d: status %v, want OK with an ok_response", i, resp.GetStatus())
		}
		h := headerMap(ok.GetResponseHeadersToAdd())
		if h["x-ratelimit-remaining"] != []string{"1", "0"}[i] || h["ratelimit-policy"] == "" {
			t.Errorf("request %d: response_headers_to_add = %v", i, h)
		}
	}
	resp, err := s.Check(ctx, checkRequest("web", "192.0.2.1", "GET", "/a", nil))
	if err != nil {
		t.Fatal(err)
	}
	denied := resp.GetDeniedResponse()
	if resp.GetStatus().GetCode() != int32(codes.ResourceExhausted) || denied == nil || denied.GetStatus().GetCode() != typev3.StatusCode_TooManyRequests {
		t.Fatalf("third request: %v, want RESOURCE_EXHAUSTED with a 429 denied_response", resp)
	}
	h := headerMap(denied.GetHeaders())
	if h["retry-after"] != "60" || h["x-ratelimit-remaining"] != "0" || h["x-envoy-ratelimited"] != "true" {
		t.Errorf("denied headers = %v, want retry-after 60, remaining 0, x-envoy-ratelimited", h)
	}
	// Another client has its own budget.
	if resp, _ := s.Check(ctx, checkRequest("web", "192.0.2.2", "GET", "/a", nil)); resp.GetStatus().GetCode() != 0 {
		t.Errorf("another address was denied: %v", resp.GetStatus())
	}
}

func TestCheckDescriptorFromMethodAndPath(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	if resp, _ := s.Check(ctx, checkRequest("web", "192.0.2.5", "POST", "/orders", nil)); resp.GetStatus().GetCode() != 0 {
		t.Fatalf("first POST /orders denied")
	}
	if resp, _ := s.Check(ctx, checkRequest("web", "192.0.2.6", "POST", "/orders", nil)); resp.GetStatus().GetCode() == 0 {
		t.Errorf("second POST /orders (1 per hour per path, any client) admitted")
	}
	if resp, _ := s.Check(ctx, checkRequest("web", "192.0.2.7", "GET", "/orders", nil)); resp.GetStatus().GetCode() != 0 {
		t.Errorf("GET /orders denied: the POST descriptor must not apply")
	}
}

func TestClientAddress(t *testing.T) {
	ctx := context.Background()
	// A client cannot pick its address with X-Forwarded-For when no proxy is
	// trusted: three requests with different XFF from one peer share a budget.
	s := newServer(t)
	for i, xff := range []string{"1.1.1.1", "2.2.2.2", "3.3.3.3"} {
		resp, _ := s.Check(ctx, checkRequest("web", "198.51.100.1", "GET", "/", map[string]string{"x-forwarded-for": xff}))
		if got, want := resp.GetStatus().GetCode() == 0, i < 2; got != want {
			t.Errorf("request %d with XFF %s: allowed %v, want %v (the peer's budget)", i, xff, got, want)
		}
	}
	// x-envoy-external-address, set by an edge Envoy, is the client.
	for i := range 3 {
		resp, _ := s.Check(ctx, checkRequest("web", "10.0.0.1", "GET", "/", map[string]string{"x-envoy-external-address": "203.0.113.50"}))
		if got, want := resp.GetStatus().GetCode() == 0, i < 2; got != want {
			t.Errorf("request %d via x-envoy-external-address: allowed %v, want %v", i, got, want)
		}
	}
	if resp, _ := s.Check(ctx, checkRequest("web", "10.0.0.1", "GET", "/", nil)); resp.GetStatus().GetCode() != 0 {
		t.Errorf("the proxy's own address shares the external client's budget")
	}
	// With a trusted proxy, its X-Forwarded-For hop is believed.
	s = newServer(t, "10.0.0.0/8")
	for _, xff := range []string{"9.9.9.1", "9.9.9.2", "9.9.9.3"} {
		resp, _ := s.Check(ctx, checkRequest("web", "10.0.0.9", "GET", "/", map[string]string{"x-forwarded-for": "6.6.6.6, " + xff}))
		if resp.GetStatus().GetCode() != 0 {
			t.Errorf("XFF %s through a trusted proxy denied: each hop is its own client", xff)
		}
	}
}

func TestCheckErrors(t *testing.T) {
	s := newServer(t)
	ctx := context.Background()
	if _, err := s.Check(ctx, checkRequest("", "192.0.2.1", "GET", "/", nil)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Check without a domain = %v, want InvalidArgument", err)
	}
	if _, err := s.Check(ctx, checkRequest("nope", "192.0.2.1", "GET", "/", nil)); status.Code(err) != codes.NotFound {
		t.Errorf("Check(unknown domain) = %v, want NotFound", err)
	}
	if _, err := s.Check(ctx, &authv3.CheckRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Check(empty request) = %v, want InvalidArgument", err)
	}
}
