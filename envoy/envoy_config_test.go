// Package envoy_test checks envoy.yaml, the front-proxy config shipped for
// rls, without an Envoy binary: against Envoy's API protos and rules
// (validate_test.go), against what this repository's docker-compose.yaml
// and config/limits.yaml expect, and it proves the checks catch a table of
// broken variants.
package envoy_test

import (
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	ratelimitcfgv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/rlsproject/rls/internal/config"
)

const (
	envoyFile  = "envoy.yaml"
	limitsFile = "../config/limits.yaml"
)

func readEnvoyYAML(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(envoyFile)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// loadEnvoy parses and validates envoy.yaml, failing the test on any
// problem.
func loadEnvoy(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	bs, err := validateYAML(envoyFile, readEnvoyYAML(t))
	if err != nil {
		t.Fatalf("envoy.yaml is not a valid Envoy bootstrap:\n%v", err)
	}
	return bs
}

// unpack returns the message of type T packed in a.
func unpack[T proto.Message](t *testing.T, a *anypb.Any) T {
	t.Helper()
	var zero T
	m := zero.ProtoReflect().New().Interface().(T)
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("unpack %s as %T: %v", a.GetTypeUrl(), m, err)
	}
	return m
}

// repack replaces a's contents with m.
func repack(t *testing.T, a *anypb.Any, m proto.Message) {
	t.Helper()
	if err := a.MarshalFrom(m); err != nil {
		t.Fatal(err)
	}
}

func listenerNamed(t *testing.T, bs *bootstrapv3.Bootstrap, name string) *listenerv3.Listener {
	t.Helper()
	for _, l := range bs.GetStaticResources().GetListeners() {
		if l.GetName() == name {
			return l
		}
	}
	t.Fatalf("envoy.yaml has no listener %q", name)
	return nil
}

// hcm returns the http_connection_manager of listener l (its only filter
// chain's last filter).
func hcm(t *testing.T, l *listenerv3.Listener) *hcmv3.HttpConnectionManager {
	t.Helper()
	if len(l.GetFilterChains()) != 1 {
		t.Fatalf("listener %s: %d filter chains, want 1", l.GetName(), len(l.GetFilterChains()))
	}
	fs := l.GetFilterChains()[0].GetFilters()
	return unpack[*hcmv3.HttpConnectionManager](t, fs[len(fs)-1].GetTypedConfig())
}

// httpFilter returns the config of the http_filter of type T in h.
func httpFilter[T proto.Message](t *testing.T, h *hcmv3.HttpConnectionManager) T {
	t.Helper()
	var zero T
	for _, f := range h.GetHttpFilters() {
		if f.GetTypedConfig().MessageIs(zero) {
			return unpack[T](t, f.GetTypedConfig())
		}
	}
	t.Fatalf("%s: no http_filter of type %T", h.GetStatPrefix(), zero)
	return zero
}

func TestEnvoyConfigValid(t *testing.T) {
	loadEnvoy(t)
}

// TestEnvoyConfigWiring pins what envoy.yaml promises its readers and what
// docker-compose.yaml relies on: ports, the rate-limit filter's settings,
// ext_authz's domain, the clusters.
func TestEnvoyConfigWiring(t *testing.T) {
	bs := loadEnvoy(t)
	if got := bs.GetAdmin().GetAddress().GetSocketAddress().GetPortValue(); got != 9901 {
		t.Errorf("admin port = %d, want 9901", got)
	}
	ports := map[string]uint32{"ratelimit": 10000, "extauthz": 10001}
	for name, want := range ports {
		l := listenerNamed(t, bs, name)
		if got := l.GetAddress().GetSocketAddress().GetPortValue(); got != want {
			t.Errorf("listener %s: port %d, want %d", name, got, want)
		}
		h := hcm(t, l)
		if !h.GetUseRemoteAddress().GetValue() {
			t.Errorf("listener %s: use_remote_address is not true: remote_address would not be the client's", name)
		}
		if len(h.GetAccessLog()) == 0 {
			t.Errorf("listener %s: no access_log", name)
		}
		if last := h.GetHttpFilters()[len(h.GetHttpFilters())-1]; !last.GetTypedConfig().MessageIs((*routerv3.Router)(nil)) {
			t.Errorf("listener %s: last http_filter is %s, want the router", name, last.GetName())
		}
	}

	rl := httpFilter[*ratelimitv3.RateLimit](t, hcm(t, listenerNamed(t, bs, "ratelimit")))
	if rl.GetDomain() != "api" {
		t.Errorf("ratelimit filter: domain %q, want api", rl.GetDomain())
	}
	if d := rl.GetTimeout().AsDuration(); d <= 20*time.Millisecond || d > time.Second {
		t.Errorf("ratelimit filter: timeout %v, want more than Envoy's 20ms default and at most 1s", d)
	}
	if rl.GetFailureModeDeny() {
		t.Error("ratelimit filter: failure_mode_deny is true, want false (fail open)")
	}
	if got := rl.GetEnableXRatelimitHeaders(); got != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
		t.Errorf("ratelimit filter: enable_x_ratelimit_headers %s, want DRAFT_VERSION_03", got)
	}
	if got := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != "rls" {
		t.Errorf("ratelimit filter: rate_limit_service cluster %q, want rls", got)
	}

	az := httpFilter[*extauthzv3.ExtAuthz](t, hcm(t, listenerNamed(t, bs, "extauthz")))
	if got := az.GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != "rls" {
		t.Errorf("ext_authz filter: cluster %q, want rls", got)
	}
	if d := az.GetGrpcService().GetTimeout().AsDuration(); d <= 0 || d > time.Second {
		t.Errorf("ext_authz filter: timeout %v, want set and at most 1s", d)
	}
	if !az.GetFailureModeAllow() {
		t.Error("ext_authz filter: failure_mode_allow is false, want true (fail open, as the ratelimit filter)")
	}

	want := map[string]string{"rls": "rls:8081", "backend": "backend:80"}
	for _, c := range bs.GetStaticResources().GetClusters() {
		var addrs []string
		for _, e := range c.GetLoadAssignment().GetEndpoints() {
			for _, le := range e.GetLbEndpoints() {
				sa := le.GetEndpoint().GetAddress().GetSocketAddress()
				addrs = append(addrs, sa.GetAddress()+":"+strconv.FormatUint(uint64(sa.GetPortValue()), 10))
			}
		}
		if got := strings.Join(addrs, ","); got != want[c.GetName()] {
			t.Errorf("cluster %s: endpoints %q, want %q", c.GetName(), got, want[c.GetName()])
		}
		if c.GetType() != clusterv3.Cluster_STRICT_DNS {
			t.Errorf("cluster %s: type %s, want STRICT_DNS (docker-compose service names)", c.GetName(), c.GetType())
		}
		delete(want, c.GetName())
	}
	for name := range want {
		t.Errorf("envoy.yaml has no cluster %q", name)
	}
}

// sampleRequest is a request as Envoy sees it after the connection
// manager: the trusted client address and the headers, pseudo-headers
// included, lower-case. It implements httpdesc.Request.
type sampleRequest struct {
	client  netip.Addr
	headers map[string]string
}

func (r sampleRequest) Header(name string) (string, bool) {
	v, ok := r.headers[name]
	return v, ok
}

func (r sampleRequest) ClientAddr() netip.Addr { return r.client }

// envoyDescriptor returns the descriptor Envoy builds from rl for r, with
// Envoy's rules (§B of the protocol notes): entries in action order; an
// action that cannot produce its entry drops the descriptor unless it is
// skip_if_absent. ok is false when there is no descriptor. Only the
// actions rls's examples use are modelled; another one fails the test.
func envoyDescriptor(t *testing.T, rl *routev3.RateLimit, r sampleRequest) (entries []config.Entry, ok bool) {
	t.Helper()
	for _, a := range rl.GetActions() {
		switch {
		case a.GetRemoteAddress() != nil:
			if !r.client.IsValid() {
				return nil, false
			}
			entries = append(entries, config.Entry{Key: "remote_address", Value: r.client.String()})
		case a.GetRequestHeaders() != nil:
			rh := a.GetRequestHeaders()
			v, found := r.headers[strings.ToLower(rh.GetHeaderName())]
			switch {
			case found:
				entries = append(entries, config.Entry{Key: rh.GetDescriptorKey(), Value: v})
			case !rh.GetSkipIfAbsent():
				return nil, false
			}
		case a.GetGenericKey() != nil:
			gk := a.GetGenericKey()
			key := gk.GetDescriptorKey()
			if key == "" {
				key = "generic_key"
			}
			entries = append(entries, config.Entry{Key: key, Value: gk.GetDescriptorValue()})
		default:
			t.Fatalf("rate_limits action %v is not modelled by envoyDescriptor: teach it Envoy's rule for it", a)
		}
	}
	return entries, len(entries) > 0
}

// routeRateLimits returns the rate_limits Envoy applies on route rt of
// vhost vh for a filter at stage: the route's, else the virtual host's
// (Envoy's default OVERRIDE), keeping those of that stage.
func routeRateLimits(t *testing.T, vh *routev3.VirtualHost, rt *routev3.Route, stage uint32) []*routev3.RateLimit {
	t.Helper()
	if _, ok := rt.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"]; ok {
		t.Fatalf("route %s: RateLimitPerRoute is not modelled by this test", rt.GetName())
	}
	all := rt.GetRoute().GetRateLimits()
	if len(all) == 0 {
		all = vh.GetRateLimits()
	}
	var out []*routev3.RateLimit
	for _, rl := range all {
		if rl.GetStage().GetValue() == stage {
			out = append(out, rl)
		}
	}
	return out
}

// TestEnvoyDescriptorsMatchLimits checks that the descriptors Envoy sends
// from envoy.yaml's rate_limits reach nodes with limits in
// config/limits.yaml, and that rls's http_descriptors (which ext_authz on
// :10001 uses) build the very same ones, so a client is counted alike on
// both listeners.
func TestEnvoyDescriptorsMatchLimits(t *testing.T) {
	bs := loadEnvoy(t)
	cfg, err := config.Load(limitsFile)
	if err != nil {
		t.Fatalf("config.Load(%s): %v", limitsFile, err)
	}

	h := hcm(t, listenerNamed(t, bs, "ratelimit"))
	filter := httpFilter[*ratelimitv3.RateLimit](t, h)
	if len(filter.GetRateLimits()) > 0 {
		t.Fatal("the ratelimit filter's own rate_limits are not modelled by this test")
	}
	domain := cfg.Domain(filter.GetDomain())
	if domain == nil {
		t.Fatalf("the ratelimit filter's domain %q is not in %s", filter.GetDomain(), limitsFile)
	}

	client := netip.MustParseAddr("203.0.113.7")
	withKey := sampleRequest{client, map[string]string{
		":method": "GET", ":path": "/api/v1/users", ":authority": "localhost:10000", "x-api-key": "k1",
	}}
	anonymous := sampleRequest{client, map[string]string{
		":method": "GET", ":path": "/api/v1/users", ":authority": "localhost:10000",
	}}
	requests := []struct {
		name string
		r    sampleRequest
		want [][]config.Entry
	}{
		{"with x-api-key", withKey, [][]config.Entry{
			{{Key: "remote_address", Value: "203.0.113.7"}},
			{{Key: "api_key", Value: "k1"}},
			{{Key: "path", Value: "/api/v1/users"}},
		}},
		{"without x-api-key", anonymous, [][]config.Entry{
			{{Key: "remote_address", Value: "203.0.113.7"}},
			{{Key: "path", Value: "/api/v1/users"}},
		}},
	}

	routes := 0
	for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			routes++
			rls := routeRateLimits(t, vh, rt, filter.GetStage())
			for _, req := range requests {
				var got [][]config.Entry
				for _, rl := range rls {
					if entries, ok := envoyDescriptor(t, rl, req.r); ok {
						got = append(got, entries)
					}
				}
				if !reflect.DeepEqual(got, req.want) {
					t.Errorf("vhost %s route %v, request %s: Envoy sends %v, want %v", vh.GetName(), rt.GetMatch(), req.name, got, req.want)
				}
				for _, entries := range got {
					n := domain.Match(entries)
					if n == nil || len(n.Limits) == 0 {
						t.Errorf("route %v, request %s: descriptor %v reaches no limit in domain %s of %s", rt.GetMatch(), req.name, entries, domain.Name, limitsFile)
						continue
					}
					t.Logf("request %s: %v -> %s (%d limits)", req.name, entries, n.Path, len(n.Limits))
				}
				if authz := domain.HTTPDescriptors.Build(req.r, nil); !reflect.DeepEqual(authz, got) {
					t.Errorf("request %s: ext_authz (http_descriptors of %s) builds %v, the ratelimit filter %v: the two listeners would count differently", req.name, domain.Name, authz, got)
				}
			}
		}
	}
	if routes == 0 {
		t.Fatal("the ratelimit listener has no route")
	}

	// ext_authz names the domain in each route's context_extensions; rls
	// builds descriptors with that domain's http_descriptors.
	ah := hcm(t, listenerNamed(t, bs, "extauthz"))
	for _, vh := range ah.GetRouteConfig().GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			a := rt.GetTypedPerFilterConfig()["envoy.filters.http.ext_authz"]
			if a == nil {
				t.Errorf("extauthz route %v: no ExtAuthzPerRoute: rls answers InvalidArgument without context_extensions[\"domain\"]", rt.GetMatch())
				continue
			}
			per := unpack[*extauthzv3.ExtAuthzPerRoute](t, a)
			name := per.GetCheckSettings().GetContextExtensions()["domain"]
			d := cfg.Domain(name)
			switch {
			case d == nil:
				t.Errorf("extauthz route %v: context_extensions domain %q is not in %s", rt.GetMatch(), name, limitsFile)
			case len(d.HTTPDescriptors) == 0:
				t.Errorf("extauthz route %v: domain %q has no http_descriptors: ext_authz would limit nothing", rt.GetMatch(), name)
			}
		}
	}
}

// TestEnvoyConfigBroken proves the checks catch typical mistakes: each
// variant of envoy.yaml, made by editing its text or its parsed form, must
// fail with the error given.
func TestEnvoyConfigBroken(t *testing.T) {
	good := string(readEnvoyYAML(t))
	tests := []struct {
		name string
		// edit changes the YAML text; mutate the parsed bootstrap.
		edit   func(t *testing.T, s string) string
		mutate func(t *testing.T, bs *bootstrapv3.Bootstrap)
		want   string // a regexp the error must match
	}{
		{
			name: "misspelled field",
			edit: replaceOnce("rate_limit_service:", "rate_limit_servce:"),
			want: `^envoy\.yaml:\d+: .*unknown field "rate_limit_servce"`,
		},
		{
			name: "misspelled action",
			edit: replaceOnce("- remote_address: {}", "- remote_adress: {}"),
			want: `^envoy\.yaml:\d+: .*unknown field "remote_adress"`,
		},
		{
			name: "duration as a number",
			edit: replaceOnce("timeout: 0.1s\n                      # Fail open", "timeout: 100\n                      # Fail open"),
			want: `^envoy\.yaml: .*syntax error \(line 1:\d+\): unexpected token 100`,
		},
		{
			name: "wrong enum",
			edit: replaceOnce("DRAFT_VERSION_03", "DRAFT_VERSION_04"),
			want: `^envoy\.yaml:\d+: .*invalid value for enum field enableXRatelimitHeaders: "DRAFT_VERSION_04"`,
		},
		{
			name: "unknown @type",
			edit: replaceOnce("filters.http.ratelimit.v3.RateLimit\n", "filters.http.ratelimit.v3.RateLimiter\n"),
			want: `^envoy\.yaml:\d+: .*unable to resolve "type\.googleapis\.com/envoy\.extensions\.filters\.http\.ratelimit\.v3\.RateLimiter"`,
		},
		{
			name: "stage 11",
			edit: insertAfter("domain: api\n                      # Envoy's default is 20 ms", "stage: 11"),
			want: `http_filters\[envoy\.filters\.http\.ratelimit\]\.typed_config<RateLimit>: invalid RateLimit\.Stage: value must be less than or equal to 10`,
		},
		{
			name: "empty domain",
			edit: replaceOnce("domain: api\n                      # Envoy's default", "domain: \"\"\n                      # Envoy's default"),
			want: `typed_config<RateLimit>: invalid RateLimit\.Domain: value length must be at least 1 runes`,
		},
		{
			name: "request_headers without descriptor_key",
			edit: replaceOnce("descriptor_key: api_key\n", ""),
			want: `typed_config<HttpConnectionManager>: .*invalid RateLimit_Action_RequestHeaders\.DescriptorKey: value length must be at least 1 runes`,
		},
		{
			name: "admin port out of range",
			edit: replaceOnce("port_value: 9901}", "port_value: 99010}"),
			want: `invalid SocketAddress\.PortValue: value must be less than or equal to 65535`,
		},
		{
			name: "envoy_grpc and google_grpc together",
			edit: replaceOnce("envoy_grpc: {cluster_name: rls}\n                        # Required",
				"envoy_grpc: {cluster_name: rls}\n                          google_grpc: {target_uri: \"rls:8081\", stat_prefix: rls}\n                        # Required"),
			want: `^envoy\.yaml:\d+: .*oneof envoy\.config\.core\.v3\.GrpcService\.target_specifier is already set`,
		},
		{
			name: "transport AUTO on the ratelimit service",
			edit: replaceOnce("transport_api_version: V3\n                  # The router", "transport_api_version: AUTO\n                  # The router"),
			want: `typed_config<RateLimit>\.rate_limit_service: transport_api_version is AUTO, must be V3`,
		},
		{
			name: "no transport_api_version on ext_authz",
			edit: replaceOnce("transport_api_version: V3\n                      # Fail open", "# Fail open"),
			want: `http_filters\[envoy\.filters\.http\.ext_authz\]\.typed_config<ExtAuthz>: transport_api_version is AUTO, must be V3`,
		},
		{
			name: "unknown gRPC cluster",
			edit: replaceOnce("envoy_grpc: {cluster_name: rls}\n                        # Required", "envoy_grpc: {cluster_name: ratelimiter}\n                        # Required"),
			want: `rate_limit_service\.grpc_service\.envoy_grpc\.cluster_name: unknown cluster "ratelimiter" referenced \(static_resources\.clusters: backend, rls\)`,
		},
		{
			name: "unknown route cluster",
			edit: replaceOnce("cluster: backend\n                          typed_per_filter_config", "cluster: backnd\n                          typed_per_filter_config"),
			want: `routes\[0\]\.route\.cluster: unknown cluster "backnd" referenced`,
		},
		{
			name: "deprecated field",
			edit: insertAfter("cluster: backend\n                            # Each rate_limits", "include_vh_rate_limits: true"),
			want: `route\.include_vh_rate_limits: deprecated field envoy\.config\.route\.v3\.RouteAction\.include_vh_rate_limits`,
		},
		{
			name: "router not last",
			mutate: func(t *testing.T, bs *bootstrapv3.Bootstrap) {
				editHCM(t, bs, "ratelimit", func(h *hcmv3.HttpConnectionManager) {
					fs := h.GetHttpFilters()
					fs[0], fs[1] = fs[1], fs[0]
				})
			},
			want: `http_filters\[envoy\.filters\.http\.router\]: terminal filter "envoy\.filters\.http\.router" must be the last http_filter \(it is 1 of 2\)`,
		},
		{
			name: "no router",
			mutate: func(t *testing.T, bs *bootstrapv3.Bootstrap) {
				editHCM(t, bs, "extauthz", func(h *hcmv3.HttpConnectionManager) {
					h.HttpFilters = h.GetHttpFilters()[:1]
				})
			},
			want: `the last http_filter is "envoy\.filters\.http\.ext_authz", not the router`,
		},
		{
			name: "network filter after the connection manager",
			mutate: func(t *testing.T, bs *bootstrapv3.Bootstrap) {
				l := listenerNamed(t, bs, "ratelimit")
				cfg, err := anypb.New(&netratelimitv3.RateLimit{
					StatPrefix:  "tcp",
					Domain:      "api",
					Descriptors: []*rlcommonv3.RateLimitDescriptor{{Entries: []*rlcommonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}},
					RateLimitService: &ratelimitcfgv3.RateLimitServiceConfig{
						GrpcService:         &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "rls"}}},
						TransportApiVersion: corev3.ApiVersion_V3,
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				fc := l.GetFilterChains()[0]
				fc.Filters = append(fc.Filters, &listenerv3.Filter{Name: "envoy.filters.network.ratelimit", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: cfg}})
			},
			want: `terminal filter "envoy\.filters\.network\.http_connection_manager" must be the last network filter`,
		},
		{
			name: "gRPC cluster without HTTP/2",
			mutate: func(t *testing.T, bs *bootstrapv3.Bootstrap) {
				clusterNamed(t, bs, "rls").TypedExtensionProtocolOptions = nil
			},
			want: `cluster "rls" is used by envoy_grpc but is not configured for HTTP/2`,
		},
		{
			name: "duplicate cluster",
			mutate: func(t *testing.T, bs *bootstrapv3.Bootstrap) {
				sr := bs.GetStaticResources()
				sr.Clusters = append(sr.Clusters, proto.Clone(clusterNamed(t, bs, "backend")).(*clusterv3.Cluster))
			},
			want: `cluster "backend" is defined twice`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.edit != nil {
				_, err = validateYAML(envoyFile, []byte(tt.edit(t, good)))
			} else {
				bs, perr := parseBootstrap(envoyFile, []byte(good))
				if perr != nil {
					t.Fatal(perr)
				}
				tt.mutate(t, bs)
				err = checkBootstrap(bs)
			}
			if err == nil {
				t.Fatalf("the broken variant passed the checks; want an error matching %s", tt.want)
			}
			if !regexp.MustCompile(tt.want).MatchString(err.Error()) {
				t.Fatalf("error:\n%v\nwant one matching %s", err, tt.want)
			}
			t.Logf("caught: %v", err)
		})
	}
}

// replaceOnce returns an edit that replaces old, which must occur exactly
// once in the file, by new.
func replaceOnce(old, new string) func(*testing.T, string) string {
	return func(t *testing.T, s string) string {
		t.Helper()
		if n := strings.Count(s, old); n != 1 {
			t.Fatalf("envoy.yaml holds %q %d times, want once: update this variant", old, n)
		}
		return strings.Replace(s, old, new, 1)
	}
}

// insertAfter returns an edit that inserts line, indented as the anchor's
// first line, after that line; anchor must occur exactly once.
func insertAfter(anchor, line string) func(*testing.T, string) string {
	return func(t *testing.T, s string) string {
		t.Helper()
		if n := strings.Count(s, anchor); n != 1 {
			t.Fatalf("envoy.yaml holds %q %d times, want once: update this variant", anchor, n)
		}
		i := strings.Index(s, anchor)
		start := strings.LastIndex(s[:i], "\n") + 1
		indent := s[start:i]
		end := i + strings.Index(s[i:], "\n") + 1
		return s[:end] + indent + line + "\n" + s[end:]
	}
}

func clusterNamed(t *testing.T, bs *bootstrapv3.Bootstrap, name string) *clusterv3.Cluster {
	t.Helper()
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("envoy.yaml has no cluster %q", name)
	return nil
}

// editHCM applies f to the http_connection_manager of listener name and
// packs the result back.
func editHCM(t *testing.T, bs *bootstrapv3.Bootstrap, name string, f func(*hcmv3.HttpConnectionManager)) {
	t.Helper()
	fs := listenerNamed(t, bs, name).GetFilterChains()[0].GetFilters()
	a := fs[len(fs)-1].GetTypedConfig()
	h := unpack[*hcmv3.HttpConnectionManager](t, a)
	f(h)
	repack(t, a, h)
}
