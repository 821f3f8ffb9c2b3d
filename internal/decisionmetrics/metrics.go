package decisionmetrics

import (
	"hash/fnv"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/series"
	"github.com/rlsproject/rls/internal/service"
)

// metrics are rls's Prometheus metrics of decisions. Label values come from the
// config (domain names, limit labels), and from request values only where
// the config asks for them (detailed_metric, value_to_metric), bounded per
// limit. A limit's series are made when it first decides, not when the
// config loads, and deleted when a reload drops the limit (series.Family).
type metrics struct {
	decisions      *prometheus.CounterVec // domain, limit, result
	shadowDenials  *prometheus.CounterVec // domain, limit
	resets         prometheus.Counter     // Reset calls that cleared
	resetCounters  prometheus.Counter     // counters they cleared
	valueDecisions *prometheus.CounterVec // domain, limit, descriptor, result
	requests       *prometheus.CounterVec // code
	storeLatency   *prometheus.HistogramVec
	storeErrors    prometheus.Counter
	reloadOK       prometheus.Gauge
	reloadTime     prometheus.Gauge
	reloads        *prometheus.CounterVec // result
	domains        prometheus.Gauge
	limits         prometheus.Gauge
	storeOK        prometheus.Observer
	storeFailed    prometheus.Observer
	requestsOK     prometheus.Counter
	requestsOver   prometheus.Counter
	requestsError  prometheus.Counter

	// limitSeries are the per-limit series: decisions by result, then
	// shadowDenials (shadowCounter), by domain and limit.
	limitSeries *series.Family
	// valueSeries are the per-value series: valueDecisions by result, by
	// domain, limit and descriptor; a group per limit, of at most
	// --metrics-max-values descriptors, then OtherSeries.
	valueSeries *series.Family
}

// DefaultMaxValueSeries is the default of Options.MaxValueSeries.
const DefaultMaxValueSeries = 100

// OtherSeries is the descriptor label of the series into which a limit's
// values fold once it has MaxValueSeries of them.
const OtherSeries = series.Other

// newMetrics returns the service's metrics, registered in reg when it is
// not nil; maxValues (more than 0) bounds each limit's per-value series.
func newMetrics(reg prometheus.Registerer, maxValues int, shadowAll bool) *metrics {
	shadowMode := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rls_shadow_mode",
		Help: "1 when --shadow puts every limit in shadow mode (nothing is denied), else 0.",
	})
	if shadowAll {
		shadowMode.Set(1)
	}
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_decisions_total",
			Help: "Verdicts on limits, by domain, limit (its name, or descriptor path and window) and result (ok, over_limit, shadow_over_limit).",
		}, []string{"domain", "limit", "result"}),
		shadowDenials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_shadow_denials_total",
			Help: "Hits that a shadow-mode limit would have denied.",
		}, []string{"domain", "limit"}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_resets_total",
			Help: "Resets of counters (POST /admin/reset, rls reset) that reached the store.",
		}),
		resetCounters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_reset_counters_total",
			Help: "Counters that resets cleared (those that held state).",
		}),
		valueDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_descriptor_decisions_total",
			Help: "Verdicts on limits whose descriptor asks for per-value series (detailed_metric: the request's values at every level; value_to_metric: at that level), by domain, limit, descriptor (the path with those values) and result; beyond --metrics-max-values values per limit, in descriptor=\"" + OtherSeries + "\".",
		}, []string{"domain", "limit", "descriptor", "result"}),
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
		reg.MustRegister(shadowMode, m.resets, m.resetCounters, m.decisions, m.shadowDenials, m.valueDecisions, m.requests, m.storeLatency, m.storeErrors,
			m.reloadOK, m.reloadTime, m.reloads, m.domains, m.limits)
	}
	m.storeOK = m.storeLatency.WithLabelValues("ok")
	m.storeFailed = m.storeLatency.WithLabelValues("error")
	m.requestsOK = m.requests.WithLabelValues("OK")
	m.requestsOver = m.requests.WithLabelValues("OVER_LIMIT")
	m.requestsError = m.requests.WithLabelValues("error")
	m.limitSeries = series.New(series.Options{
		Labels:   []string{"domain", "limit"},
		Counters: append(byResult(m.decisions), m.shadowDenials),
	})
	m.valueSeries = series.New(series.Options{
		Labels:   []string{"domain", "limit", "descriptor"},
		Counters: byResult(m.valueDecisions),
		Max:      maxValues,
		Overflow: []string{OtherSeries},
	})
	return m
}

// result is a limit's verdict in a decision, as the result label says it.
type result uint8

const (
	resultOK result = iota
	resultOver
	resultShadowOver
	numResults
)

var resultLabel = [numResults]string{"ok", "over_limit", "shadow_over_limit"}

// shadowCounter is the index of rls_shadow_denials_total in
// metrics.limitSeries, after the results'.
const shadowCounter = int(numResults)

// byResult returns vec curried with each result label, by result.
func byResult(vec *prometheus.CounterVec) []*prometheus.CounterVec {
	vecs := make([]*prometheus.CounterVec, numResults)
	for r, label := range resultLabel {
		vecs[r] = vec.MustCurryWith(prometheus.Labels{"result": label})
	}
	return vecs
}

// limitMetrics are the series of one limit of a loaded config. Safe for
// concurrent use.
type limitMetrics struct {
	series *series.Series
	// values are the per-value series when the limit's descriptor asks for
	// them; node is then the limit's node.
	values *series.Group
	node   *config.Descriptor
	// sample is the limit's fullness sample (fullness.go), made on first
	// use, or kept from the previous config.
	sample atomic.Pointer[keySample]
}

// count counts verdict r of the limit for a request descriptor with
// entries; buf is scratch space for a descriptor label, returned grown.
func (lm *limitMetrics) count(r result, entries []config.Entry, buf []byte) []byte {
	lm.series.Counter(int(r)).Inc()
	if r == resultShadowOver {
		lm.series.Counter(shadowCounter).Inc()
	}
	if lm.values != nil && len(entries) == lm.node.Depth+1 {
		buf = series.EndLabel(appendValueLabel(buf[:0], lm.node, entries), 0)
		lm.values.Get(buf).Counter(int(r)).Inc()
	}
	return buf
}

// forConfig returns the metrics of cfg's limits (by Limit.Index) and of its
// request overrides (by domain), and deletes the series of the limits that
// the previous config had and cfg has not.
func (m *metrics) forConfig(cfg *config.Config) (byLimit []limitMetrics, override map[string]*limitMetrics) {
	limits, values := m.limitSeries.Reload(), m.valueSeries.Reload()
	defer limits.Commit()
	defer values.Commit()
	byLimit = make([]limitMetrics, len(cfg.Limits()))
	override = make(map[string]*limitMetrics, len(cfg.Domains()))
	for _, d := range cfg.Domains() {
		override[d.Name] = &limitMetrics{series: limits.Series(d.Name, service.OverrideLabel)}
		walk(d.Descriptors, func(l *config.Limit) {
			lm := &byLimit[l.Index]
			lm.series = limits.Series(d.Name, l.Label)
			if perValue(l.Descriptor) {
				lm.values, lm.node = values.Group("", d.Name, l.Label), l.Descriptor
			}
		})
	}
	return byLimit, override
}

// perValue reports whether the limits of node n are counted per value:
// n has detailed_metric, or a level of its path has value_to_metric.
func perValue(n *config.Descriptor) bool {
	if n.DetailedMetric {
		return true
	}
	for ; n != nil; n = n.Parent {
		if n.ValueToMetric {
			return true
		}
	}
	return false
}

// appendValueLabel appends the descriptor label of entries, which matched
// node, as envoyproxy/ratelimit builds its stats keys: per level the key,
// then "=" and the configured value (a wildcard's pattern) when there is
// one; the request's value instead at every level when the node has
// detailed_metric, and at the levels with value_to_metric otherwise.
// Levels are joined with "/", as in Descriptor.Path. Request values are
// made valid UTF-8 and shortened past 64 bytes (with a hash, so that they
// stay apart).
func appendValueLabel(dst []byte, node *config.Descriptor, entries []config.Entry) []byte {
	var levels [service.MaxEntries]*config.Descriptor
	for n := node; n != nil; n = n.Parent {
		levels[n.Depth] = n
	}
	for i, e := range entries {
		n := levels[i]
		if i > 0 {
			dst = append(dst, '/')
		}
		dst = append(dst, n.Key...)
		switch {
		case node.DetailedMetric || n.ValueToMetric:
			dst = append(dst, '=')
			dst = appendLabelValue(dst, e.Value)
		case n.Value != "":
			dst = append(dst, '=')
			dst = append(dst, n.Value...)
		}
	}
	return dst
}

// maxLabelValue bounds a request value in a label.
const maxLabelValue = 64

func appendLabelValue(dst []byte, v string) []byte {
	if len(v) <= maxLabelValue && utf8.ValidString(v) {
		return append(dst, v...)
	}
	h := fnv.New64a()
	h.Write([]byte(v))
	short := strings.ToValidUTF8(v[:min(len(v), maxLabelValue-16)], "\uFFFD")
	dst = append(dst, short...)
	dst = append(dst, "…#"...)
	return strconv.AppendUint(dst, h.Sum64()&0xffffffff, 16)
}

// walk calls f for every limit in the trees.
func walk(nodes []*config.Descriptor, f func(*config.Limit)) {
	for _, n := range nodes {
		for _, l := range n.Limits {
			f(l)
		}
		walk(n.Children, f)
	}
}
