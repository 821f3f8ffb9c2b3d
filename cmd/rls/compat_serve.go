package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/rlsproject/rls/internal/compat"
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/xdsconfig"
)

// withHealthcheck serves GET /healthcheck, as envoyproxy/ratelimit does
// (Envoy Gateway's probes ask it), in front of next: 200 "OK" while a
// config is loaded and the server is not shutting down, else 500. Unlike
// /readyz it does not follow the store, as in the reference: a Redis
// outage must not make Kubernetes restart every replica.
func (d *daemon) withHealthcheck(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthcheck" {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch {
		case d.draining.Load():
			http.Error(w, "shutting down", http.StatusInternalServerError)
		case d.svc.Config() == nil:
			http.Error(w, "no config loaded", http.StatusInternalServerError)
		default:
			io.WriteString(w, "OK")
		}
	})
}

// startCompat starts what compatibility mode serves beside the gRPC and
// HTTP listeners: the debug listener (/rlconfig, /debug/pprof), the
// Prometheus listener (USE_PROMETHEUS; with the local cache's gauges of
// store's denial cache, and EXTRA_TAGS) and the xDS client. What it
// started is stopped by stopCompat, and on error here.
func (d *daemon) startCompat(ctx context.Context, reg *prometheus.Registry, store engine.Store) (err error) {
	c := d.o.compat
	if c == nil {
		return nil
	}
	if rs, ok := store.(*redisstore.Store); ok {
		if _, on := rs.DenyCacheStats(); on {
			reg.MustRegister(localCacheCollectors(rs)...)
		}
	}
	defer func() {
		if err != nil {
			d.stopCompat()
		}
	}()
	debug := http.NewServeMux()
	debug.HandleFunc("GET /rlconfig", d.rlconfig)
	httpapi.RegisterPprof(debug, nil)
	lim := extraLimits(d.o.httpLimits)
	if _, err := d.serveExtra("DEBUG_HOST:DEBUG_PORT", c.debugAddr, debug, lim); err != nil {
		return err
	}
	if c.promAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET "+c.promPath, promhttp.HandlerFor(taggedGatherer{reg, c.extraTags}, promhttp.HandlerOpts{}))
		if _, err := d.serveExtra("PROMETHEUS_ADDR", c.promAddr, mux, lim); err != nil {
			return err
		}
	}
	if c.xds != nil {
		x := *c.xds
		x.Logger = d.log
		xctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		d.extraStop = append(d.extraStop, func() { cancel(); <-done })
		go func() {
			defer close(done)
			if err := xdsconfig.New(x, xdsTarget{d}).Run(xctx); err != nil {
				d.log.Error("xDS client stopped", "error", err)
			}
		}()
	}
	for _, v := range c.ignored {
		d.log.Info("environment variable ignored", "variable", v)
	}
	return nil
}

// extraMaxConnections bounds the open connections of each of the debug
// and Prometheus listeners: their clients are a few scrapers and
// operators, and a flood there must not take the file descriptors that the
// HTTP and gRPC listeners need.
const extraMaxConnections = 64

// extraLimits are the limits of the debug and Prometheus listeners: the
// HTTP listener's (timeouts, header size), with at most
// extraMaxConnections connections.
func extraLimits(l httpapi.Limits) httpapi.Limits {
	if l.MaxConnections <= 0 || l.MaxConnections > extraMaxConnections {
		l.MaxConnections = extraMaxConnections
	}
	return l
}

// serveExtra serves h on addr (named what in errors) within lim until
// stopCompat, and returns the address it listens on. Its connections'
// metrics are not registered: rls_http_connections is the HTTP
// listener's.
func (d *daemon) serveExtra(what, addr string, h http.Handler, lim httpapi.Limits) (net.Addr, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	srv := httpapi.NewServer(h, lim, d.log, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("listener stopped", "listener", what, "error", err)
		}
	}()
	d.extraStop = append(d.extraStop, func() {
		// Requests in flight get the shutdown's time; past it, what is left
		// ends within the write timeout.
		ctx, cancel := context.WithTimeout(context.Background(), d.o.shutdownTimeout)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})
	d.log.Info("serving", "listener", what, "addr", lis.Addr().String())
	return lis.Addr(), nil
}

// stopCompat stops what startCompat started, in reverse order. It may be
// called more than once.
func (d *daemon) stopCompat() {
	for i := len(d.extraStop) - 1; i >= 0; i-- {
		d.extraStop[i]()
	}
	d.extraStop = nil
}

// xdsTarget loads the configs of the xDS client into the service, through
// the loader's validation; a refused set keeps the old config and is
// NACKed.
type xdsTarget struct{ d *daemon }

func (t xdsTarget) Load(version string, configs []*rlsconfv3.RateLimitConfig) error {
	return t.d.svc.Reload(func() (*config.Config, error) {
		cfg, err := compat.FromXDS(t.d.o.configLimits.Parse, configs)
		if err != nil {
			return nil, fmt.Errorf("xDS version %s: %w", version, err)
		}
		logWarnings(cfg, t.d.log)
		return cfg, nil
	})
}

// rlconfig writes the loaded config, one line per limit, as the
// reference's /rlconfig does: the stats key, unit and requests_per_unit.
func (d *daemon) rlconfig(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	cfg := d.svc.Config()
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

// localCacheCollectors are envoyproxy/ratelimit's local cache gauges
// (ratelimit.localcache.*, freecache's counters, which its Prometheus
// mapping leaves unmapped: ratelimit_localcache_<name>), read from the
// Redis store's denial cache at each scrape. Lookups and hits count
// requests (the reference's, descriptors); averageAccessTime has no
// meaning here and is not exported.
func localCacheCollectors(s *redisstore.Store) []prometheus.Collector {
	gauge := func(name, help string, f func(redisstore.DenyCacheStats) uint64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ratelimit_localcache_" + name, Help: help + " (envoyproxy/ratelimit's local cache stat: rls's denial cache)."},
			func() float64 {
				st, _ := s.DenyCacheStats()
				return float64(f(st))
			})
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
