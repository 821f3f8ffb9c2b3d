package rlqs

import "github.com/prometheus/client_golang/prometheus"

// metrics are the service's own: what its clients report and what it
// hands out. A grant's requests count in rls_decisions_total too (as one
// request of that many hits); these say what became of them.
type metrics struct {
	streams    prometheus.GaugeFunc
	buckets    prometheus.Gauge
	reported   *prometheus.CounterVec        // requests clients report, by result
	allowed    prometheus.Counter            // reported{result="allowed"}
	denied     prometheus.Counter            // reported{result="denied"}
	actions    *prometheus.CounterVec        // actions sent, by kind
	sent       map[string]prometheus.Counter // actions, by kind: the series made once
	granted    prometheus.Counter            // requests of the grants taken
	givenBack  prometheus.Counter            // unused requests of grants given back
	overuse    prometheus.Counter            // requests beyond a grant, charged at a report
	overuseNot prometheus.Counter            // of those, the ones the limit had no room for
}

// The kinds of action of rls_rlqs_actions_total.
const (
	actionTokenBucket = "token_bucket"
	actionDenyAll     = "deny_all"
	actionAllowAll    = "allow_all"
	actionAbandon     = "abandon"
)

func newMetrics(streams func() float64) *metrics {
	m := &metrics{
		streams: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rls_rlqs_streams",
			Help: "RLQS streams served now."}, streams),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rls_rlqs_buckets",
			Help: "Buckets of the RLQS streams served now."}),
		reported: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rls_rlqs_requests_reported_total",
			Help: "Requests that RLQS clients report having decided themselves, by result (allowed, denied)."}, []string{"result"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rls_rlqs_actions_total",
			Help: "Bucket actions sent to RLQS clients, by kind: token_bucket (a grant), deny_all (the limit is spent), allow_all (no limit), abandon (a reload removed the limit)."}, []string{"action"}),
		granted: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_granted_requests_total",
			Help: "Requests of the grants handed out (counted in the store when taken)."}),
		givenBack: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_given_back_requests_total",
			Help: "Requests of grants that their clients did not use, given back to the store while their window lasted."}),
		overuse: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_overuse_requests_total",
			Help: "Requests that clients allowed beyond their grants (before a first assignment, or under a fallback), charged at their next report."}),
		overuseNot: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_overuse_uncharged_requests_total",
			Help: "Requests allowed beyond grants that the limit had no room left for: admitted over the limit."}),
	}
	m.allowed, m.denied = m.reported.WithLabelValues("allowed"), m.reported.WithLabelValues("denied")
	m.sent = make(map[string]prometheus.Counter)
	for _, a := range []string{actionTokenBucket, actionDenyAll, actionAllowAll, actionAbandon} {
		m.sent[a] = m.actions.WithLabelValues(a)
	}
	return m
}

// Collectors returns the service's metrics (rls_rlqs_*). The caller
// registers them.
func (s *Server) Collectors() []prometheus.Collector {
	m := s.metrics
	return []prometheus.Collector{m.streams, m.buckets, m.reported, m.actions, m.granted, m.givenBack, m.overuse, m.overuseNot}
}
