package decisionmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/series"
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
	perDomain  *series.Family         // unmatched, impossible (the *Counter constants)
	unknown    domainSeries           // UnknownDomainSeries, never deleted
}

// The counters of domainMetrics.perDomain.
const (
	unmatchedCounter = iota
	impossibleCounter
)

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
	}
	m.perDomain = series.New(series.Options{Labels: []string{"domain"}, Counters: []*prometheus.CounterVec{m.unmatched, m.impossible}})
	m.unknown = domainSeries{m.perDomain.Permanent(UnknownDomainSeries)}
	if reg != nil {
		reg.MustRegister(m.unmatched, m.impossible)
	}
	return m
}

// domainSeries are the series of one domain, made on first use. Safe for
// concurrent use.
type domainSeries struct{ s *series.Series }

// countUnmatched adds n descriptors that matched no limit.
func (ds domainSeries) countUnmatched(n int) { ds.s.Counter(unmatchedCounter).Add(float64(n)) }

// countImpossible counts a request that can never pass.
func (ds domainSeries) countImpossible() { ds.s.Counter(impossibleCounter).Inc() }

// forConfig returns the series of cfg's domains, keeping those of domains
// that the previous config had too, and deletes the series of the domains
// that cfg has not.
func (m *domainMetrics) forConfig(cfg *config.Config) map[string]domainSeries {
	r := m.perDomain.Reload()
	defer r.Commit()
	live := make(map[string]domainSeries, len(cfg.Domains()))
	for _, d := range cfg.Domains() {
		live[d.Name] = domainSeries{r.Series(d.Name)}
	}
	return live
}
