package decisionmetrics

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/series"
)

// limitValues exports what the current config says of its limits, so
// that a dashboard can set a limit's decisions beside its value:
// rls_limit_requests_per_unit and rls_limit_window_seconds, by domain and
// limit as rls_decisions_total. A limit shows when its rls_decisions_total
// series do (made on its first decision, kept by a reload that keeps the
// limit): a config of 100,000 limits of which a few are in use exports a
// few, and a reload that drops a limit drops its values at once, as they
// are read from the current config at each scrape. Limits that share a
// label (one name given to several) share their series and show the
// values of the first of them in the config. Unlimited limits have none.
// It is a prometheus.Collector, safe for concurrent use.
type limitValues struct {
	current         *atomic.Pointer[configMetrics]
	perUnit, window *prometheus.Desc
}

func newLimitValues(current *atomic.Pointer[configMetrics]) *limitValues {
	labels := []string{"domain", "limit"}
	return &limitValues{
		current: current,
		perUnit: prometheus.NewDesc("rls_limit_requests_per_unit",
			"A limit's requests_per_unit in the loaded config (a concurrency limit's most requests in flight; request overrides aside), by domain and limit as in rls_decisions_total, for the limits whose rls_decisions_total series exist.",
			labels, nil),
		window: prometheus.NewDesc("rls_limit_window_seconds",
			"A limit's window in the loaded config: unit_multiplier × unit (a calendar unit's nominal length; a concurrency limit's lease_ttl), by domain and limit as rls_limit_requests_per_unit.",
			labels, nil),
	}
}

// Describe implements prometheus.Collector.
func (lv *limitValues) Describe(ch chan<- *prometheus.Desc) {
	ch <- lv.perUnit
	ch <- lv.window
}

// Collect implements prometheus.Collector: the values of the current
// config's limits whose series are made.
func (lv *limitValues) Collect(ch chan<- prometheus.Metric) {
	ld := lv.current.Load()
	if ld == nil {
		return
	}
	seen := make(map[*series.Series]bool)
	for _, d := range ld.cfg.Domains() {
		walk(d.Descriptors, func(l *config.Limit) {
			s := ld.counters[l.Index].series
			if l.Rule == nil || seen[s] || !s.Made() {
				return
			}
			seen[s] = true
			// Label values as the series have them (Prometheus takes
			// valid UTF-8 only; a YAML escape can make other bytes).
			dom, label := strings.ToValidUTF8(d.Name, "\uFFFD"), strings.ToValidUTF8(l.Label, "\uFFFD")
			ch <- prometheus.MustNewConstMetric(lv.perUnit, prometheus.GaugeValue, float64(l.Rule.Limit), dom, label)
			ch <- prometheus.MustNewConstMetric(lv.window, prometheus.GaugeValue, l.Rule.Window.Seconds(), dom, label)
		})
	}
}
