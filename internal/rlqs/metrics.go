package rlqs

import (
	"github.com/prometheus/client_golang/prometheus"

	grants "github.com/rlsproject/rls/internal/engine/grant"
)

// metrics are the service's own: what its clients report (bounded to what
// is plausible) and what it hands out. Payments count in
// rls_decisions_total too (as one request of that many hits); these say
// what became of them.
type metrics struct {
	streams       prometheus.GaugeFunc
	buckets       prometheus.Gauge
	reported      *prometheus.CounterVec        // requests clients report, by result
	allowed       prometheus.Counter            // reported{result="allowed"}
	denied        prometheus.Counter            // reported{result="denied"}
	actions       *prometheus.CounterVec        // actions sent, by kind
	sent          map[string]prometheus.Counter // actions, by kind: the series made once
	granted       prometheus.CounterFunc        // requests taken for the assignments (the ledger's)
	released      prometheus.CounterFunc        // requests taken that clients could not spend, released
	unreleased    prometheus.CounterFunc        // of those, the ones whose release failed
	overuse       prometheus.Counter            // requests beyond assignments, charged at a report
	overuseNot    prometheus.Counter            // of those, the ones the limit had no room for
	unknownDomain prometheus.Counter            // bucket reports of streams of unknown domains
}

// The kinds of action of rls_rlqs_actions_total.
const (
	actionTokenBucket = "token_bucket"
	actionDenyAll     = "deny_all"
	actionAllowAll    = "allow_all"
	actionAbandon     = "abandon"
)

func newMetrics(streams func() float64, ledger *grants.Ledger) *metrics {
	fromLedger := func(f func(grants.Counts) uint64) func() float64 {
		return func() float64 { return float64(f(ledger.Counts())) }
	}
	m := &metrics{
		streams: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rls_rlqs_streams",
			Help: "RLQS streams served now."}, streams),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rls_rlqs_buckets",
			Help: "Buckets of the RLQS streams served now."}),
		reported: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rls_rlqs_requests_reported_total",
			Help: "Requests that RLQS clients report having decided themselves, by result (allowed, denied)."}, []string{"result"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rls_rlqs_actions_total",
			Help: "Bucket actions sent to RLQS clients, by kind: token_bucket (a grant), deny_all (the limit is spent), allow_all (no limit), abandon (a reload removed the limit)."}, []string{"action"}),
		granted: prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rls_rlqs_granted_requests_total",
			Help: "Requests taken in the store for the token buckets handed out, before their clients can spend them."},
			fromLedger(func(c grants.Counts) uint64 { return c.Taken })),
		released: prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rls_rlqs_given_back_requests_total",
			Help: "Requests taken that a replaced token bucket could no longer spend, released while their window lasted."},
			fromLedger(func(c grants.Counts) uint64 { return c.Released })),
		unreleased: prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rls_rlqs_given_back_lost_requests_total",
			Help: "Requests to release that stayed counted: a reload changed the counters that took them, or the store failed."},
			fromLedger(func(c grants.Counts) uint64 { return c.Unlanded })),
		overuse: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_overuse_requests_total",
			Help: "Requests that clients report beyond what their assignments let them admit (before a first assignment, or under a fallback), charged at the report."}),
		overuseNot: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_overuse_uncharged_requests_total",
			Help: "Requests reported beyond assignments that the limit had no room left for."}),
		unknownDomain: prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_unknown_domain_total",
			Help: "Bucket reports of streams whose domain the config does not have, answered ALLOW_ALL until the next report."}),
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
	return []prometheus.Collector{m.streams, m.buckets, m.reported, m.actions, m.granted, m.released, m.unreleased,
		m.overuse, m.overuseNot, m.unknownDomain}
}
