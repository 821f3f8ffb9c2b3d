package compat

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/service"
)

// debugHandler is what the debug listener (DEBUG_HOST:DEBUG_PORT) serves:
// /rlconfig and /debug/pprof.
func debugHandler(svc *service.Service, _ prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, _ *http.Request) { rlconfig(w, svc.Config()) })
	httpapi.RegisterPprof(mux, nil)
	return mux
}

// rlconfig writes cfg, one line per limit, as the reference's /rlconfig
// does: the stats key, unit and requests_per_unit.
func rlconfig(w http.ResponseWriter, cfg *config.Config) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if cfg == nil {
		io.WriteString(w, "no config loaded\n")
		return
	}
	for _, dm := range cfg.Domains() {
		writeRLConfig(w, dm.Name, dm.Descriptors)
	}
}

// writeRLConfig writes the limits of nodes and their subtrees under the
// stats key prefix.
func writeRLConfig(w io.Writer, prefix string, nodes []*config.Descriptor) {
	for _, n := range nodes {
		key := prefix + "." + n.Key
		if n.Value != "" {
			key += "_" + n.Value
		}
		for _, l := range n.Limits {
			if l.Unlimited {
				fmt.Fprintf(w, "%s: unlimited, shadow_mode: %t\n", key, l.Shadow)
				continue
			}
			fmt.Fprintf(w, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t\n", key, strings.ToUpper(l.Rule.Unit.String()), l.Rule.Limit, l.Shadow)
		}
		writeRLConfig(w, key, n.Children)
	}
}

// prometheusHandler is what the Prometheus listener (USE_PROMETHEUS on
// PROMETHEUS_ADDR) serves: the server's metrics on path, with the labels
// tags (EXTRA_TAGS) on every series.
func prometheusHandler(path string, tags []tag) func(*service.Service, prometheus.Gatherer) http.Handler {
	return func(_ *service.Service, metrics prometheus.Gatherer) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("GET "+path, promhttp.HandlerFor(taggedGatherer{metrics, tags}, promhttp.HandlerOpts{}))
		return mux
	}
}

// localCacheCollectors are envoyproxy/ratelimit's local cache gauges
// (ratelimit.localcache.*, freecache's counters, which its Prometheus
// mapping leaves unmapped: ratelimit_localcache_<name>), read from the
// Redis store's denial cache (read) at each scrape. Lookups and hits
// count requests (the reference's, descriptors); averageAccessTime has no
// meaning here and is not exported.
func localCacheCollectors(read func() redisstore.DenyCacheStats) []prometheus.Collector {
	gauge := func(name, help string, f func(redisstore.DenyCacheStats) uint64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimit_localcache_" + name, Help: help + " (envoyproxy/ratelimit's local cache stat: rls's denial cache)."},
			func() float64 { return float64(f(read())) })
	}
	return []prometheus.Collector{
		gauge("lookupCount", "Requests that asked the denial cache", func(st redisstore.DenyCacheStats) uint64 { return st.Lookups }),
		gauge("hitCount", "Requests denied from the denial cache", func(st redisstore.DenyCacheStats) uint64 { return st.Hits }),
		gauge("missCount", "Requests the denial cache sent to Redis", func(st redisstore.DenyCacheStats) uint64 { return st.Lookups - st.Hits }),
		gauge("entryCount", "Denials held", func(st redisstore.DenyCacheStats) uint64 { return st.Entries }),
		gauge("evacuateCount", "Denials dropped to make room while they held", func(st redisstore.DenyCacheStats) uint64 { return st.Evicted }),
		gauge("expiredCount", "Denials dropped past their instant", func(st redisstore.DenyCacheStats) uint64 { return st.Expired }),
		gauge("overwriteCount", "Denials replaced by a newer one of their counter", func(st redisstore.DenyCacheStats) uint64 { return st.Overwritten }),
	}
}

// taggedGatherer is g with the labels tags (EXTRA_TAGS) on every series:
// the reference's stats library puts them on all its stats. A series that
// has a label of one of those names keeps its own. Safe for concurrent use.
type taggedGatherer struct {
	g    prometheus.Gatherer
	tags []tag // sorted by name
}

func (t taggedGatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := t.g.Gather()
	if len(t.tags) == 0 {
		return mfs, err
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			own := m.GetLabel()
			for _, tg := range t.tags {
				if !slices.ContainsFunc(own, func(l *dto.LabelPair) bool { return l.GetName() == tg.name }) {
					m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(tg.name), Value: proto.String(tg.value)})
				}
			}
			slices.SortFunc(m.Label, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
		}
	}
	return mfs, err
}

// withClientSAN returns base (the gRPC listener's TLS config) with a check
// that the client's certificate carries the name san
// (GRPC_CLIENT_TLS_SAN).
func withClientSAN(base *tls.Config, san string) *tls.Config {
	inner := base.GetConfigForClient
	out := base.Clone()
	out.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		cfg, err := inner(h)
		if err != nil || cfg == nil {
			return cfg, err
		}
		cfg = cfg.Clone()
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !hasSAN(cs.PeerCertificates[0], san) {
				return fmt.Errorf("client certificate does not carry the name %q (GRPC_CLIENT_TLS_SAN)", san)
			}
			return nil
		}
		return cfg, nil
	}
	return out
}

// hasSAN reports whether cert names san among its DNS names, URIs, IP
// addresses or e-mail addresses.
func hasSAN(cert *x509.Certificate, san string) bool {
	if slices.Contains(cert.DNSNames, san) || slices.Contains(cert.EmailAddresses, san) {
		return true
	}
	for _, u := range cert.URIs {
		if u.String() == san {
			return true
		}
	}
	for _, ip := range cert.IPAddresses {
		if ip.String() == san {
			return true
		}
	}
	return false
}
