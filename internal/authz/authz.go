// Package authz is the gRPC adapter of Envoy's ext_authz v3
// (envoy.service.auth.v3.Authorization/Check): it turns the request
// attributes into the HTTP request that a domain's http_descriptors read,
// and the service's verdict into an OK or a 429 denied response with
// rate-limit headers. It holds no rate-limit logic.
package authz

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/clientip"
	"github.com/rlsproject/rls/internal/httpdesc"
	"github.com/rlsproject/rls/internal/service"
)

// Checker decides plain HTTP requests; *service.Service implements it.
type Checker interface {
	CheckHTTP(ctx context.Context, domain string, r httpdesc.Request) (*service.Response, error)
}

// domainKey is the context_extensions key that names the domain.
const domainKey = "domain"

// Server implements authv3.AuthorizationServer. It is safe for concurrent
// use.
type Server struct {
	authv3.UnimplementedAuthorizationServer
	svc     Checker
	trusted clientip.Trusted
}

// New returns a server that asks svc. trusted are the proxies whose
// X-Forwarded-For is believed when Envoy did not set
// x-envoy-external-address; with none, the client is the TCP peer.
func New(svc Checker, trusted []netip.Prefix) *Server {
	return &Server{svc: svc, trusted: trusted}
}

// Register registers s on g.
func (s *Server) Register(g *grpc.Server) { authv3.RegisterAuthorizationServer(g, s) }

// Check implements ext_authz. A missing domain or an unknown one is a gRPC
// error (InvalidArgument, NotFound), and so is a store failure under
// --on-store-error=error (Unavailable): Envoy then applies its own
// failure_mode_allow.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	attrs := req.GetAttributes()
	domain := attrs.GetContextExtensions()[domainKey]
	if domain == "" {
		return nil, status.Error(codes.InvalidArgument, `attributes.context_extensions["domain"]: must name the rate-limit domain (set it in the route's ExtAuthzPerRoute.check_settings)`)
	}
	hr := &httpRequest{http: attrs.GetRequest().GetHttp(), client: s.client(attrs)}
	resp, err := s.svc.CheckHTTP(ctx, domain, hr)
	switch {
	case errors.Is(err, service.ErrUnknownDomain):
		return nil, status.Errorf(codes.NotFound, "unknown rate-limit domain %q", domain)
	case err != nil:
		var inv *service.InvalidError
		if errors.As(err, &inv) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	headers := make([]*corev3.HeaderValueOption, 0, len(resp.Headers))
	for _, h := range resp.Headers {
		headers = append(headers, &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: strings.ToLower(h.Key), Value: h.Value},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
	}
	if resp.Code == service.OverLimit {
		body := "rate limited; retry after " + strconv.FormatInt(resp.RetryAfter(), 10) + "s\n"
		if resp.Never {
			body = "rate limited: the request asks more than a limit ever admits\n"
		}
		return &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: int32(codes.ResourceExhausted), Message: "rate limited"},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
				Headers: append(headers, &corev3.HeaderValueOption{
					Header:       &corev3.HeaderValue{Key: "x-envoy-ratelimited", Value: "true"},
					AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
				}),
				Body: body,
			}},
		}, nil
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			ResponseHeadersToAdd: headers,
		}},
	}, nil
}

// client returns the client address: x-envoy-external-address when Envoy
// set it (an edge Envoy sets it to the address it trusts), else the TCP
// peer, or an X-Forwarded-For hop when the peer is a trusted proxy.
func (s *Server) client(attrs *authv3.AttributeContext) netip.Addr {
	http := attrs.GetRequest().GetHttp()
	if v, ok := header(http, "x-envoy-external-address"); ok {
		if a, ok := clientip.Parse(v); ok {
			return a
		}
	}
	peer, _ := clientip.Parse(attrs.GetSource().GetAddress().GetSocketAddress().GetAddress())
	if xff, ok := header(http, "x-forwarded-for"); ok && len(s.trusted) > 0 {
		return s.trusted.FromForwarded(peer, []string{xff})
	}
	return peer
}

// header returns the value of the request header name (lower case).
//
// Envoy describes the headers in one of two ways. By default, in the
// headers map: values of a repeated header joined with ",", and bytes that
// are not UTF-8 replaced by "!". With encode_raw_headers: true (which Envoy
// recommends), the map is empty and header_map lists every header line with
// its bytes as they are (raw_value); the lines of a repeated header are then
// joined here the same way, so that a descriptor gets the same value
// whichever setting Envoy uses.
func header(http *authv3.AttributeContext_HttpRequest, name string) (string, bool) {
	if v, ok := http.GetHeaders()[name]; ok {
		return v, true
	}
	var joined []byte
	found := false
	for _, h := range http.GetHeaderMap().GetHeaders() {
		if !strings.EqualFold(h.GetKey(), name) {
			continue
		}
		v := h.GetRawValue()
		if len(v) == 0 {
			v = []byte(h.GetValue())
		}
		if found {
			joined = append(joined, ',')
		}
		joined = append(joined, v...)
		found = true
	}
	return string(joined), found
}

// httpRequest is the request as Envoy describes it.
type httpRequest struct {
	http   *authv3.AttributeContext_HttpRequest
	client netip.Addr
}

func (r *httpRequest) Header(name string) (string, bool) {
	// The joined value of a repeated header is used as is (a single value
	// may contain commas too).
	if v, ok := header(r.http, name); ok {
		return v, true
	}
	switch name {
	case ":method":
		return r.http.GetMethod(), r.http.GetMethod() != ""
	case ":path":
		return r.http.GetPath(), r.http.GetPath() != ""
	case ":authority":
		return r.http.GetHost(), r.http.GetHost() != ""
	}
	return "", false
}

func (r *httpRequest) ClientAddr() netip.Addr { return r.client }
