package service

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/descriptors"
)

// metrics are the service's Prometheus metrics. Label values come from the
// config only (domain names that exist, limit labels), never from requests.
type metrics struct {
	decisions     *prometheus.CounterVec // domain, limit, result
	shadowDenials *prometheus.CounterVec // domain, limit
	requests      *prometheus.CounterVec // code
	storeLatency  *prometheus.HistogramVec
	storeErrors   prometheus.Counter
	reloadOK      prometheus.Gauge
	reloadTime    prometheus.Gauge
	reloads       *prometheus.CounterVec // result
	domains       prometheus.Gauge
	limits        prometheus.Gauge
	storeOK       prometheus.Observer
	storeFailed   prometheus.Observer
	requestsOK    prometheus.Counter
	requestsOver  prometheus.Counter
	requestsError prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_decisions_total",
			Help: "Verdicts on limits, by domain, limit (its name, or descriptor path and window) and result (ok, over_limit, shadow_over_limit).",
		}, []string{"domain", "limit", "result"}),
		shadowDenials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_shadow_denials_total",
			Help: "Hits that a shadow-mode limit would have denied.",
		}, []string{"domain", "limit"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_requests_total",
			Help: "Rate-limit requests answered, by overall code (OK, OVER_LIMIT, error).",
		}, []string{"code"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rls_store_duration_seconds",
			Help:    "Time of one store call (one decision), by outcome.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}, []string{"outcome"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_store_errors_total",
			Help: "Store calls that failed or timed out.",
		}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_last_reload_successful",
			Help: "1 when the last config load succeeded, 0 when it failed (the previous config stays in use).",
		}),
		reloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_last_reload_success_timestamp_seconds",
			Help: "Time of the last successful config load.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_config_reloads_total",
			Help: "Config loads, by result (success, failure).",
		}, []string{"result"}),
		domains: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_domains",
			Help: "Domains in the loaded config.",
		}),
		limits: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_limits",
			Help: "Limits in the loaded config.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.shadowDenials, m.requests, m.storeLatency, m.storeErrors,
			m.reloadOK, m.reloadTime, m.reloads, m.domains, m.limits)
	}
	m.storeOK = m.storeLatency.WithLabelValues("ok")
	m.storeFailed = m.storeLatency.WithLabelValues("error")
	m.requestsOK = m.requests.WithLabelValues("OK")
	m.requestsOver = m.requests.WithLabelValues("OVER_LIMIT")
	m.requestsError = m.requests.WithLabelValues("error")
	return m
}

// limitCounters are the counters of one limit, resolved once per config so
// that the hot path does no label lookups.
type limitCounters struct {
	ok, over, shadowOver, shadowDenials prometheus.Counter
}

func (m *metrics) countersFor(cfg *descriptors.Config) []limitCounters {
	out := make([]limitCounters, len(cfg.Limits()))
	for _, d := range cfg.Domains() {
		walk(d.Descriptors, func(l *descriptors.Limit) {
			out[l.Index] = limitCounters{
				ok:            m.decisions.WithLabelValues(d.Name, l.Label, "ok"),
				over:          m.decisions.WithLabelValues(d.Name, l.Label, "over_limit"),
				shadowOver:    m.decisions.WithLabelValues(d.Name, l.Label, "shadow_over_limit"),
				shadowDenials: m.shadowDenials.WithLabelValues(d.Name, l.Label),
			}
		})
	}
	return out
}

// walk calls f for every limit in the trees.
func walk(nodes []*descriptors.Descriptor, f func(*descriptors.Limit)) {
	for _, n := range nodes {
		for _, l := range n.Limits {
			f(l)
		}
		walk(n.Children, f)
	}
}
