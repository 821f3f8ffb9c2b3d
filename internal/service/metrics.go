package service

import (
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
)

// metrics are the service's Prometheus metrics. Label values come from the
// config (domain names, limit labels), and from request values only where
// the config asks for them (detailed_metric, value_to_metric), bounded per
// limit. A limit's series are made when it first decides, not when the
// config loads, and deleted when a reload drops the limit.
type metrics struct {
	decisions      *prometheus.CounterVec // domain, limit, result
	shadowDenials  *prometheus.CounterVec // domain, limit
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

	maxValues int // distinct descriptor series per limit, then OtherSeries

	// mu orders the making of per-limit series against their deletion by a
	// reload, so that a request still on the old config cannot make again a
	// series that the reload deleted.
	mu     sync.Mutex
	live   []*limitMetrics            // the current config's
	values map[seriesKey]*valueSeries // the current config's per-value series
}

// DefaultMaxValueSeries is the default of Options.MaxValueSeries.
const DefaultMaxValueSeries = 100

// OtherSeries is the descriptor label of the series into which a limit's
// values fold once it has MaxValueSeries of them.
const OtherSeries = "_other"

func newMetrics(reg prometheus.Registerer, maxValues int) *metrics {
	if maxValues <= 0 {
		maxValues = DefaultMaxValueSeries
	}
	m := &metrics{
		maxValues: maxValues,
		values:    make(map[seriesKey]*valueSeries),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_decisions_total",
			Help: "Verdicts on limits, by domain, limit (its name, or descriptor path and window) and result (ok, over_limit, shadow_over_limit).",
		}, []string{"domain", "limit", "result"}),
		shadowDenials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_shadow_denials_total",
			Help: "Hits that a shadow-mode limit would have denied.",
		}, []string{"domain", "limit"}),
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
		reg.MustRegister(m.decisions, m.shadowDenials, m.valueDecisions, m.requests, m.storeLatency, m.storeErrors,
			m.reloadOK, m.reloadTime, m.reloads, m.domains, m.limits)
	}
	m.storeOK = m.storeLatency.WithLabelValues("ok")
	m.storeFailed = m.storeLatency.WithLabelValues("error")
	m.requestsOK = m.requests.WithLabelValues("OK")
	m.requestsOver = m.requests.WithLabelValues("OVER_LIMIT")
	m.requestsError = m.requests.WithLabelValues("error")
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

// seriesKey names a limit's series: limits of one domain with the same
// label share them.
type seriesKey struct{ domain, label string }

// limitMetrics are the series of one limit of a loaded config, made on
// first use. Safe for concurrent use.
type limitMetrics struct {
	m       *metrics
	key     seriesKey
	results [numResults]atomic.Pointer[prometheus.Counter]
	shadow  atomic.Pointer[prometheus.Counter] // rls_shadow_denials_total
	// values are the per-value series when the limit's descriptor asks for
	// them; node is then the limit's node.
	values *valueSeries
	node   *config.Descriptor
	// removed is set (requires m.mu) when a reload dropped key: the series
	// are deleted and must not be made again.
	removed bool
}

// count counts verdict r of the limit for a request descriptor with
// entries; buf is scratch space for a descriptor label, returned grown.
func (lm *limitMetrics) count(r result, entries []config.Entry, buf []byte) []byte {
	c := lm.results[r].Load()
	if c == nil {
		c = lm.make(&lm.results[r], lm.m.decisions, lm.key.domain, lm.key.label, resultLabel[r])
	}
	(*c).Inc()
	if r == resultShadowOver {
		c := lm.shadow.Load()
		if c == nil {
			c = lm.make(&lm.shadow, lm.m.shadowDenials, lm.key.domain, lm.key.label)
		}
		(*c).Inc()
	}
	if lm.values != nil && len(entries) == lm.node.Depth+1 {
		buf = appendValueLabel(buf[:0], lm.node, entries)
		lm.values.counter(lm, buf, r).Inc()
	}
	return buf
}

// discard counts what a removed limit's late requests decide: nothing.
var discard prometheus.Counter = prometheus.NewCounter(prometheus.CounterOpts{Name: "discarded"})

// make stores in p the series of vec with labels, and returns it, unless p
// was set meanwhile or the limit was removed (then it returns discard).
func (lm *limitMetrics) make(p *atomic.Pointer[prometheus.Counter], vec *prometheus.CounterVec, labels ...string) *prometheus.Counter {
	lm.m.mu.Lock()
	defer lm.m.mu.Unlock()
	if lm.removed {
		return &discard
	}
	if c := p.Load(); c != nil {
		return c
	}
	c := vec.WithLabelValues(labels...)
	p.Store(&c)
	return &c
}

// valueSeries are the per-value series of one limit key: at most max
// distinct descriptor labels, then OtherSeries. Safe for concurrent use.
type valueSeries struct {
	mu     sync.RWMutex
	series map[string]*[numResults]prometheus.Counter // by descriptor label
}

// counter returns the counter of result r for descriptor label d (or of
// OtherSeries when the limit has its maximum of labels), making it when
// needed.
func (vs *valueSeries) counter(lm *limitMetrics, d []byte, r result) prometheus.Counter {
	vs.mu.RLock()
	cs := vs.series[string(d)]
	var c prometheus.Counter
	if cs != nil {
		c = cs[r]
	}
	vs.mu.RUnlock()
	if c != nil {
		return c
	}
	lm.m.mu.Lock() // before vs.mu, as in the reload
	defer lm.m.mu.Unlock()
	if lm.removed {
		return discard
	}
	vs.mu.Lock()
	defer vs.mu.Unlock()
	label := string(d)
	if vs.series[label] == nil && len(vs.series) >= lm.m.maxValues {
		label = OtherSeries
	}
	cs = vs.series[label]
	if cs == nil {
		cs = new([numResults]prometheus.Counter)
		vs.series[label] = cs
	}
	if cs[r] == nil {
		cs[r] = lm.m.valueDecisions.WithLabelValues(lm.key.domain, lm.key.label, label, resultLabel[r])
	}
	return cs[r]
}

// forConfig returns the metrics of cfg's limits (by Limit.Index) and of its
// request overrides (by domain), and deletes the series of the limits that
// the previous config had and cfg has not.
func (m *metrics) forConfig(cfg *config.Config) (byLimit []*limitMetrics, override map[string]*limitMetrics) {
	m.mu.Lock()
	defer m.mu.Unlock()
	byLimit = make([]*limitMetrics, len(cfg.Limits()))
	override = make(map[string]*limitMetrics, len(cfg.Domains()))
	live := make([]*limitMetrics, 0, len(byLimit)+len(cfg.Domains()))
	keys := make(map[seriesKey]bool, len(byLimit)+len(cfg.Domains()))
	values := make(map[seriesKey]*valueSeries)
	for _, d := range cfg.Domains() {
		lm := &limitMetrics{m: m, key: seriesKey{d.Name, "override"}}
		override[d.Name] = lm
		live, keys[lm.key] = append(live, lm), true
	}
	for _, d := range cfg.Domains() {
		walk(d.Descriptors, func(l *config.Limit) {
			lm := &limitMetrics{m: m, key: seriesKey{d.Name, l.Label}}
			if perValue(l.Descriptor) {
				vs := values[lm.key]
				if vs == nil {
					if vs = m.values[lm.key]; vs == nil {
						vs = &valueSeries{series: make(map[string]*[numResults]prometheus.Counter)}
					}
					values[lm.key] = vs
				}
				lm.values, lm.node = vs, l.Descriptor
			}
			byLimit[l.Index] = lm
			live, keys[lm.key] = append(live, lm), true
		})
	}
	for _, lm := range m.live {
		if keys[lm.key] {
			continue
		}
		lm.removed = true
		for _, r := range resultLabel {
			m.decisions.DeleteLabelValues(lm.key.domain, lm.key.label, r)
		}
		m.shadowDenials.DeleteLabelValues(lm.key.domain, lm.key.label)
	}
	for key, vs := range m.values {
		if values[key] == vs {
			continue
		}
		vs.mu.Lock()
		for label := range vs.series {
			for _, r := range resultLabel {
				m.valueDecisions.DeleteLabelValues(key.domain, key.label, label, r)
			}
		}
		clear(vs.series)
		vs.mu.Unlock()
	}
	m.live, m.values = live, values
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
	var levels [MaxEntries]*config.Descriptor
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
