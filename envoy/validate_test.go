package envoy_test

// This file checks an Envoy bootstrap without an Envoy binary: strict
// proto3 JSON against the API protos of go-control-plane (the version in
// go.mod, which docker-compose.yaml's Envoy image matches), the protos'
// validation rules (PGV) down into every google.protobuf.Any, and the rules
// Envoy enforces in C++ at start-up that an rls deployment depends on. What
// only a running Envoy can tell (DNS, ports, regex and formatter syntax,
// runtime keys) is out of reach; e2e runs `envoy --mode validate` where a
// Docker engine answers.

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	ratelimitcfgv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	netextauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	// The @type values an Envoy config may name resolve through
	// protoregistry.GlobalTypes: each extension must be linked in. A type
	// missing here fails with `unable to resolve "type.googleapis.com/…"`;
	// add its package.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
)

// validator is the interface of PGV's generated checks.
type validator interface{ ValidateAll() error }

// parseBootstrap turns Envoy YAML into a Bootstrap, strictly: an unknown
// field, a wrong type, a bad enum value or an unresolvable @type is an
// error. Errors about a named field or value carry the YAML line where it
// first appears (protojson only knows offsets in the converted JSON).
func parseBootstrap(name string, data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, bs); err != nil {
		return nil, fmt.Errorf("%s%s: %w", name, lineOf(data, err), err)
	}
	return bs, nil
}

// quotedInError finds the field, value or type a protojson error names.
var quotedInError = regexp.MustCompile(`(?:unknown field|error parsing|invalid value for enum field \w+:|unable to resolve) "([^"]+)"`)

// lineOf returns ":N" for the first YAML line holding the name or value
// that err complains about, or "" when there is none to find.
func lineOf(data []byte, err error) string {
	m := quotedInError.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	for i, line := range bytes.Split(data, []byte("\n")) {
		l := string(line)
		if j := strings.Index(l, "#"); j >= 0 {
			l = l[:j]
		}
		if strings.Contains(l, m[1]+":") || strings.Contains(l, ": "+m[1]) {
			return ":" + strconv.Itoa(i+1)
		}
	}
	return ""
}

// validateYAML parses and checks an Envoy bootstrap; see checkBootstrap.
func validateYAML(name string, data []byte) (*bootstrapv3.Bootstrap, error) {
	bs, err := parseBootstrap(name, data)
	if err != nil {
		return nil, err
	}
	return bs, checkBootstrap(bs)
}

// checkBootstrap returns every problem of bs, joined: PGV rules of the
// bootstrap and of every message packed in an Any, fields marked
// deprecated, and Envoy's C++ start-up rules (see ownChecks).
func checkBootstrap(bs *bootstrapv3.Bootstrap) error {
	w := &walker{}
	if err := bs.ValidateAll(); err != nil {
		w.errorf("", "%v", err)
	}
	w.walk("", bs.ProtoReflect())
	w.ownChecks(bs)
	return errors.Join(w.errs...)
}

// node is a message met on the walk, with where it was met.
type node struct {
	path string
	msg  proto.Message
}

// walker visits every message of a config, Any contents included. Not
// safe for concurrent use.
type walker struct {
	nodes []node
	errs  []error
}

func (w *walker) errorf(path, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	w.errs = append(w.errs, errors.New(msg))
}

// walk records m, flags its deprecated fields and descends into its
// message fields, lists and maps.
func (w *walker) walk(path string, m protoreflect.Message) {
	w.nodes = append(w.nodes, node{path, m.Interface()})
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		fpath := string(fd.Name())
		if path != "" {
			fpath = path + "." + fpath
		}
		w.deprecated(fpath, fd, v)
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				break
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				w.walkMessage(fmt.Sprintf("%s[%q]", fpath, k.String()), mv.Message())
				return true
			})
		case fd.IsList():
			if fd.Message() == nil {
				break
			}
			l := v.List()
			for i := range l.Len() {
				w.walkMessage(fpath+"["+elementLabel(i, l.Get(i).Message())+"]", l.Get(i).Message())
			}
		case fd.Message() != nil:
			w.walkMessage(fpath, v.Message())
		}
		return true
	})
}

// elementLabel names a list element by its name field when it has one
// ("listeners[ratelimit]"), else by its index.
func elementLabel(i int, m protoreflect.Message) string {
	if fd := m.Descriptor().Fields().ByName("name"); fd != nil && fd.Kind() == protoreflect.StringKind && !fd.IsList() {
		if name := m.Get(fd).String(); name != "" {
			return name
		}
	}
	return strconv.Itoa(i)
}

// walkMessage walks m; an Any is unpacked, checked with its own PGV rules
// (which the enclosing message's ValidateAll never sees) and walked.
func (w *walker) walkMessage(path string, m protoreflect.Message) {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		w.walk(path, m)
		return
	}
	inner, err := a.UnmarshalNew()
	if err != nil {
		w.errorf(path, "%v", err)
		return
	}
	path += "<" + string(inner.ProtoReflect().Descriptor().Name()) + ">"
	if v, ok := inner.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			w.errorf(path, "%v", err)
		}
	}
	w.walk(path, inner.ProtoReflect())
}

// deprecated flags a set field, or an enum value, that the protos mark
// deprecated: Envoy warns on them and removes them in a later release.
func (w *walker) deprecated(path string, fd protoreflect.FieldDescriptor, v protoreflect.Value) {
	if opts, ok := fd.Options().(*descriptorpb.FieldOptions); ok && opts.GetDeprecated() {
		w.errorf(path, "deprecated field %s", fd.FullName())
	}
	if fd.Kind() != protoreflect.EnumKind || fd.IsMap() {
		return
	}
	check := func(n protoreflect.EnumNumber) {
		ev := fd.Enum().Values().ByNumber(n)
		if ev == nil {
			return
		}
		if opts, ok := ev.Options().(*descriptorpb.EnumValueOptions); ok && opts.GetDeprecated() {
			w.errorf(path, "deprecated enum value %s", ev.FullName())
		}
	}
	if fd.IsList() {
		for i := range v.List().Len() {
			check(v.List().Get(i).Enum())
		}
		return
	}
	check(v.Enum())
}

// clusterRef is a use of a cluster name.
type clusterRef struct {
	path, name string
	grpc       bool // an envoy_grpc target: the cluster must speak HTTP/2
}

// ownChecks applies the rules Envoy enforces in C++ rather than in the
// protos: transport_api_version V3 on gRPC services of rate limiting,
// ext_authz and xDS (AUTO, the proto default, is rejected at start-up);
// every referenced cluster defined, and HTTP/2 on those gRPC calls go to;
// the router the last and only terminal http_filter; the
// http_connection_manager or tcp_proxy last in a network filter chain; no
// two listeners or clusters with one name.
func (w *walker) ownChecks(bs *bootstrapv3.Bootstrap) {
	const v3 = corev3.ApiVersion_V3
	var refs []clusterRef
	ref := func(path, name string, grpc bool) {
		if name != "" {
			refs = append(refs, clusterRef{path, name, grpc})
		}
	}
	for _, n := range w.nodes {
		switch m := n.msg.(type) {
		case *ratelimitcfgv3.RateLimitServiceConfig:
			if m.GetTransportApiVersion() != v3 {
				w.errorf(n.path, "transport_api_version is %s, must be V3 (Envoy rejects AUTO, the default, and V2)", m.GetTransportApiVersion())
			}
		case *extauthzv3.ExtAuthz:
			if m.GetGrpcService() != nil && m.GetTransportApiVersion() != v3 {
				w.errorf(n.path, "transport_api_version is %s, must be V3 (Envoy rejects AUTO, the default, and V2)", m.GetTransportApiVersion())
			}
		case *netextauthzv3.ExtAuthz:
			if m.GetTransportApiVersion() != v3 {
				w.errorf(n.path, "transport_api_version is %s, must be V3 (Envoy rejects AUTO, the default, and V2)", m.GetTransportApiVersion())
			}
		case *corev3.ApiConfigSource:
			if m.GetApiType() != corev3.ApiConfigSource_REST && m.GetTransportApiVersion() != v3 {
				w.errorf(n.path, "transport_api_version is %s, must be V3 (Envoy rejects AUTO, the default, and V2)", m.GetTransportApiVersion())
			}
			for _, c := range m.GetClusterNames() {
				ref(n.path+".cluster_names", c, false)
			}
		case *corev3.GrpcService_EnvoyGrpc:
			ref(n.path+".cluster_name", m.GetClusterName(), true)
		case *corev3.HttpUri:
			ref(n.path+".cluster", m.GetCluster(), false)
		case *routev3.RouteAction:
			ref(n.path+".cluster", m.GetCluster(), false)
			for _, wc := range m.GetWeightedClusters().GetClusters() {
				ref(n.path+".weighted_clusters", wc.GetName(), false)
			}
			for _, mp := range m.GetRequestMirrorPolicies() {
				ref(n.path+".request_mirror_policies", mp.GetCluster(), false)
			}
		case *tcpproxyv3.TcpProxy:
			ref(n.path+".cluster", m.GetCluster(), false)
			for _, wc := range m.GetWeightedClusters().GetClusters() {
				ref(n.path+".weighted_clusters", wc.GetName(), false)
			}
		case *hcmv3.HttpConnectionManager:
			w.httpFilterOrder(n.path, m.GetHttpFilters())
		case *listenerv3.FilterChain:
			w.networkFilterOrder(n.path, m.GetFilters())
		}
	}

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		if clusters[c.GetName()] != nil {
			w.errorf("static_resources.clusters", "cluster %q is defined twice", c.GetName())
		}
		clusters[c.GetName()] = c
	}
	listeners := map[string]bool{}
	for _, l := range bs.GetStaticResources().GetListeners() {
		if listeners[l.GetName()] {
			w.errorf("static_resources.listeners", "listener %q is defined twice", l.GetName())
		}
		listeners[l.GetName()] = true
	}
	// Clusters from CDS are unknown here: references are checked only when
	// every cluster is static.
	if bs.GetDynamicResources().GetCdsConfig() != nil || bs.GetDynamicResources().GetCdsResourcesLocator() != "" {
		return
	}
	names := slices.Sorted(maps.Keys(clusters))
	for _, r := range refs {
		c := clusters[r.name]
		switch {
		case c == nil:
			w.errorf(r.path, "unknown cluster %q referenced (static_resources.clusters: %s)", r.name, strings.Join(names, ", "))
		case r.grpc && !speaksHTTP2(c):
			w.errorf(r.path, "cluster %q is used by envoy_grpc but is not configured for HTTP/2 (typed_extension_protocol_options[%q].explicit_http_config.http2_protocol_options)", r.name, httpProtocolOptionsKey)
		}
	}
}

const httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// speaksHTTP2 reports whether Envoy talks HTTP/2 to c's endpoints, as gRPC
// needs.
func speaksHTTP2(c *clusterv3.Cluster) bool {
	a := c.GetTypedExtensionProtocolOptions()[httpProtocolOptionsKey]
	if a == nil {
		return false
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	if err := a.UnmarshalTo(opts); err != nil {
		return false
	}
	return opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

// isRouter reports whether f is the router, Envoy's terminal HTTP filter.
func isRouter(f *hcmv3.HttpFilter) bool {
	return f.GetTypedConfig().MessageIs((*routerv3.Router)(nil))
}

func (w *walker) httpFilterOrder(path string, filters []*hcmv3.HttpFilter) {
	for i, f := range filters {
		if isRouter(f) && i != len(filters)-1 {
			w.errorf(fmt.Sprintf("%s.http_filters[%s]", path, f.GetName()),
				"terminal filter %q must be the last http_filter (it is %d of %d)", f.GetName(), i+1, len(filters))
		}
	}
	if n := len(filters); n > 0 && !isRouter(filters[n-1]) {
		last := filters[n-1]
		w.errorf(fmt.Sprintf("%s.http_filters[%s]", path, last.GetName()),
			"the last http_filter is %q, not the router (envoy.extensions.filters.http.router.v3.Router): requests would never reach an upstream", last.GetName())
	}
}

// terminalNetworkFilters are the network filters this check knows to be
// terminal; nonTerminalNetworkFilters those it knows are not.
var (
	terminalNetworkFilters    = []proto.Message{(*hcmv3.HttpConnectionManager)(nil), (*tcpproxyv3.TcpProxy)(nil)}
	nonTerminalNetworkFilters = []proto.Message{(*netratelimitv3.RateLimit)(nil), (*netextauthzv3.ExtAuthz)(nil)}
)

func isOneOf(a *anypb.Any, types []proto.Message) bool {
	return slices.ContainsFunc(types, a.MessageIs)
}

func (w *walker) networkFilterOrder(path string, filters []*listenerv3.Filter) {
	for i, f := range filters {
		fpath := fmt.Sprintf("%s.filters[%s]", path, f.GetName())
		last := i == len(filters)-1
		switch {
		case !last && isOneOf(f.GetTypedConfig(), terminalNetworkFilters):
			w.errorf(fpath, "terminal filter %q must be the last network filter (it is %d of %d)", f.GetName(), i+1, len(filters))
		case last && isOneOf(f.GetTypedConfig(), nonTerminalNetworkFilters):
			w.errorf(fpath, "non-terminal filter %q is the last network filter: add an http_connection_manager or tcp_proxy after it", f.GetName())
		}
	}
}
