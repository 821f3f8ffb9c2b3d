package authz

import (
	"context"
	"net/netip"
	"sort"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

const limitsYAML = `
domain: web
http_descriptors:
  - actions: [{remote_address: {}}]
  - actions:
      - header_value_match: {descriptor_value: post, headers: [{name: ":method", string_match: {exact: POST}}]}
      - request_headers: {header_name: ":path", descriptor_key: path}
  - actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: header_match
    value: post
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1}
`

func newServer(t *testing.T, trusted ...string) *Server {
	t.Helper()
	svc := servetest.Service(t, limitsYAML, service.Options{})
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

// encodings are the two ways Envoy sends the request headers: the headers
// map (the default) and header_map (encode_raw_headers: true).
var encodings = []struct {
	name string
	enc  func(*authv3.CheckRequest) *authv3.CheckRequest
}{
	{"headers", func(r *authv3.CheckRequest) *authv3.CheckRequest { return r }},
	{"encode_raw_headers", rawHeaders},
}

// rawHeaders moves the headers of r into header_map as Envoy does with
// encode_raw_headers: only key and raw_value set, the map left empty.
func rawHeaders(r *authv3.CheckRequest) *authv3.CheckRequest {
	http := r.GetAttributes().GetRequest().GetHttp()
	keys := make([]string, 0, len(http.Headers))
	for k := range http.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	m := &corev3.HeaderMap{}
	for _, k := range keys {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(http.Headers[k])})
	}
	http.Headers, http.HeaderMap = nil, m
	return r
}

func TestCheck(t *testing.T) {
	for _, e := range encodings {
		t.Run(e.name, func(t *testing.T) { testCheck(t, e.enc) })
	}
}

func testCheck(t *testing.T, enc func(*authv3.CheckRequest) *authv3.CheckRequest) {
	checkRequest := func(domain, peer, method, path string, headers map[string]string) *authv3.CheckRequest {
		return enc(checkRequest(domain, peer, method, path, headers))
	}
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
	for _, e := range encodings {
		t.Run(e.name, func(t *testing.T) { testCheckDescriptorFromMethodAndPath(t, e.enc) })
	}
}

func testCheckDescriptorFromMethodAndPath(t *testing.T, enc func(*authv3.CheckRequest) *authv3.CheckRequest) {
	checkRequest := func(domain, peer, method, path string, headers map[string]string) *authv3.CheckRequest {
		return enc(checkRequest(domain, peer, method, path, headers))
	}
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
	for _, e := range encodings {
		t.Run(e.name, func(t *testing.T) { testClientAddress(t, e.enc) })
	}
}

func testClientAddress(t *testing.T, enc func(*authv3.CheckRequest) *authv3.CheckRequest) {
	checkRequest := func(domain, peer, method, path string, headers map[string]string) *authv3.CheckRequest {
		return enc(checkRequest(domain, peer, method, path, headers))
	}
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

// TestRawHeaders checks header_map as Envoy fills it with encode_raw_headers:
// one entry per header line, bytes as they are. Over real gRPC, values that
// are not UTF-8 reach the descriptors unchanged (raw_value is bytes, so Go's
// protobuf accepts them), and the lines of a repeated header are joined with
// "," as in the headers map.
func TestRawHeaders(t *testing.T) {
	client := authv3.NewAuthorizationClient(servetest.GRPC(t, newServer(t).Register))

	peer := 0
	check := func(lines ...string) bool { // lines: key, value, key, value…
		t.Helper()
		peer++ // a new client each time: only the api_key limit (1 per hour) can deny
		req := checkRequest("web", netip.AddrFrom4([4]byte{192, 0, 2, byte(peer)}).String(), "GET", "/", nil)
		req = rawHeaders(req)
		m := req.Attributes.Request.Http.HeaderMap
		for i := 0; i < len(lines); i += 2 {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: lines[i], RawValue: []byte(lines[i+1])})
		}
		resp, err := client.Check(context.Background(), req)
		if err != nil {
			t.Fatalf("Check(%q): %v", lines, err)
		}
		return resp.GetStatus().GetCode() == 0
	}
	steps := []struct {
		lines []string
		want  bool
	}{
		{[]string{"x-api-key", "k\xff"}, true},
		{[]string{"x-api-key", "k\xff"}, false}, // same bytes, same budget
		{[]string{"x-api-key", "k\xfe"}, true},  // other bytes, its own budget
		{[]string{"x-api-key", "k!"}, true},     // not merged with what Envoy's map would show
		{[]string{"x-api-key", "a", "x-api-key", "b"}, true},
		{[]string{"x-api-key", "a,b"}, false}, // the two lines were the value "a,b"
		{[]string{"x-api-key", "a"}, true},
	}
	for i, s := range steps {
		if got := check(s.lines...); got != s.want {
			t.Errorf("step %d %q: allowed %v, want %v", i, s.lines, got, s.want)
		}
	}
}
