package service

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
)

// UnknownDomainSeries is the domain label under which descriptors of
// requests for a domain that the config does not have are counted in
// rls_descriptors_unmatched_total (label values come from the config only,
// never from requests).
const UnknownDomainSeries = "_unknown"

// domainMetrics are the per-domain series of what a config cannot answer
// well: descriptors that matched no limit (the most common misconfiguration
// of Envoy's rate_limits, or of the descriptors tree), and requests that can
// never pass. Like the limits' series they are made on first use and
// deleted when a reload drops the domain.
type domainMetrics struct {
	unmatched  *prometheus.CounterVec // domain
	impossible *prometheus.CounterVec // domain

	// mu orders the making of series against their deletion by a reload
	// (see metrics.mu).
	mu      sync.Mutex
	live    map[string]*domainSeries // the current config's, by domain
	unknown *domainSeries            // UnknownDomainSeries, never deleted
}

func newDomainMetrics(reg prometheus.Registerer) *domainMetrics {
	m := &domainMetrics{
		unmatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_descriptors_unmatched_total",
			Help: "Request descriptors that matched no limit: no node of the domain's tree (an unknown key, a value not matched, more entries than the tree is deep) or a node without limits; by domain (\"" + UnknownDomainSeries + "\" for domains the config does not have). Overrides, unlimited and replaced limits are not counted. POST /debug/explain says why a descriptor matched nothing.",
		}, []string{"domain"}),
		impossible: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_requests_impossible_total",
			Help: "Requests denied that can never pass as they are: more hits than a limit's requests_per_unit (or a token bucket's burst), or a limit of 0; answered without Retry-After. By domain.",
		}, []string{"domain"}),
		live: make(map[string]*domainSeries),
	}
	m.unknown = &domainSeries{m: m, domain: UnknownDomainSeries}
	if reg != nil {
		reg.MustRegister(m.unmatched, m.impossible)
	}
	return m
}

// domainSeries are the series of one domain, made on first use. Safe for
// concurrent use.
type domainSeries struct {
	m          *domainMetrics
	domain     string
	unmatched  atomic.Pointer[prometheus.Counter]
	impossible atomic.Pointer[prometheus.Counter]
	removed    bool // requires m.mu: a reload dropped the domain
}

// countUnmatched adds n descriptors that matched no limit.
func (ds *domainSeries) countUnmatched(n int) {
	c := ds.unmatched.Load()
	if c == nil {
		c = ds.make(&ds.unmatched, ds.m.unmatched)
	}
	(*c).Add(float64(n))
}

// countImpossible counts a request that can never pass.
func (ds *domainSeries) countImpossible() {
	c := ds.impossible.Load()
	if c == nil {
		c = ds.make(&ds.impossible, ds.m.impossible)
	}
	(*c).Inc()
}

// make stores in p the domain's series of vec and returns it, unless p was
// set meanwhile or the domain was removed (then it returns discard).
func (ds *domainSeries) make(p *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec) *prometheus.Counter {
	ds.m.mu.Lock()
	defer ds.m.mu.Unlock()
	if ds.removed {
		return &discard
	}
	if c := p.Load(); c != nil {
		return c
	}
	c := vec.WithLabelValues(ds.domain)
	p.Store(&c)
	return &c
}

// forConfig returns the series of cfg's domains, keeping those of domains
// that the previous config had too, and deletes the series of the domains
// that cfg has not.
func (m *domainMetrics) forConfig(cfg *config.Config) map[string]*domainSeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	live := make(map[string]*domainSeries, len(cfg.Domains()))
	for _, d := range cfg.Domains() {
		ds := m.live[d.Name]
		if ds == nil {
			ds = &domainSeries{m: m, domain: d.Name}
		}
		live[d.Name] = ds
	}
	for name, ds := range m.live {
		if live[name] == nil {
			ds.removed = true
			m.unmatched.DeleteLabelValues(name)
			m.impossible.DeleteLabelValues(name)
		}
	}
	m.live = live
	return live
}
