package decisionmetrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/service"
)

// Options configure Metrics.
type Options struct {
	// MaxValueSeries bounds the distinct descriptor series of one limit
	// whose descriptor asks for per-value metrics (detailed_metric,
	// value_to_metric); further values are counted in OtherSeries. 0 means
	// DefaultMaxValueSeries.
	MaxValueSeries int
	// FullnessKeysPerLimit and FullnessKeys bound the fullness sample
	// (rls_limit_keys_fullness, fullness.go): the keys at least half full
	// kept per limit, and in all. 0 means DefaultFullnessKeysPerLimit and
	// DefaultFullnessKeys.
	FullnessKeysPerLimit, FullnessKeys int
	// Now is the clock by which the fullness sample's entries expire: the
	// service's (Options.Now). nil means the monotonic clock.
	Now func() time.Time
	// ShadowAll says that --shadow puts every limit in shadow mode
	// (rls_shadow_mode).
	ShadowAll bool
}

// Metrics are rls's metrics of a service's decisions, registered in a
// registry: a service.Observer. Safe for concurrent use.
type Metrics struct {
	m    *metrics
	dm   *domainMetrics
	full *fullness
	res  *reservationMetrics
	// current is the state of the config last made current, for the
	// limits' values (limit_values.go).
	current atomic.Pointer[configMetrics]
	labels  sync.Pool // *[]byte: scratch space for request-valued labels
}

var _ service.Observer = (*Metrics)(nil)

// New returns the metrics, registered in reg.
func New(reg prometheus.Registerer, opts Options) *Metrics {
	maxValues := opts.MaxValueSeries
	if maxValues <= 0 {
		maxValues = DefaultMaxValueSeries
	}
	m := &Metrics{
		m:    newMetrics(reg, maxValues, opts.ShadowAll),
		dm:   newDomainMetrics(reg),
		full: newFullness(opts.FullnessKeysPerLimit, opts.FullnessKeys, opts.Now),
		res:  newReservationMetrics(reg),
	}
	m.labels.New = func() any { return new([]byte) }
	reg.MustRegister(m.full, newLimitValues(&m.current))
	return m
}

// configMetrics are the series of a loaded config: what ForConfig returns.
type configMetrics struct {
	cfg      *config.Config
	counters []limitMetrics           // by Limit.Index
	override map[string]*limitMetrics // by domain name
	domains  map[string]domainSeries  // by domain name
	fullGen  uint64                   // the generation of its fullness samples
	// reservations are the reservation series of its limits that reserve
	// (by Limit.Index; nil for the others).
	reservations []*limitReservations
}

// metricsOf returns the metrics of limit, of domain dom: its own, or its
// domain's for a request override.
func (cm *configMetrics) metricsOf(dom *config.Domain, limit *config.Limit) *limitMetrics {
	if limit.Index >= 0 && limit.Index < len(cm.counters) {
		return &cm.counters[limit.Index]
	}
	return cm.override[dom.Name]
}

// ForConfig implements service.Observer: the series of cfg's limits and
// domains, keeping those that the previous config had too and deleting
// the others, and the sizes of cfg.
func (m *Metrics) ForConfig(cfg *config.Config) any {
	cm := &configMetrics{cfg: cfg}
	cm.counters, cm.override = m.m.forConfig(cfg)
	cm.domains = m.dm.forConfig(cfg)
	cm.reservations = m.res.forConfig(cfg)
	cm.fullGen = m.full.forConfig(cfg, cm.counters, cm.override)
	m.current.Store(cm)
	m.m.domains.Set(float64(len(cfg.Domains())))
	m.m.limits.Set(float64(len(cfg.Limits())))
	return cm
}

// Reloaded implements service.Observer: rls_config_last_reload_successful
// is 0 from a failed load until the next success.
func (m *Metrics) Reloaded(err error) {
	if err != nil {
		m.m.reloadOK.Set(0)
		m.m.reloads.WithLabelValues("failure").Inc()
		return
	}
	m.m.reloadOK.Set(1)
	m.m.reloadTime.SetToCurrentTime()
	m.m.reloads.WithLabelValues("success").Inc()
}

// Decided implements service.Observer: the request by code, its store
// call, its unmatched descriptors, each limit's verdict and how full it
// left its key, its reservation calls, and a request that can never pass.
func (m *Metrics) Decided(state any, d *service.Decision) {
	cm, _ := state.(*configMetrics) // nil before the first config
	switch {
	case d.Response == nil:
		m.m.requestsError.Inc()
	case d.Response.Code == service.OverLimit:
		m.m.requestsOver.Inc()
	default:
		m.m.requestsOK.Inc()
	}
	if d.StoreErr != nil {
		m.m.storeErrors.Inc()
	}
	if d.StoreTime > 0 {
		if d.StoreErr != nil {
			m.m.storeFailed.Observe(d.StoreTime.Seconds())
		} else {
			m.m.storeOK.Observe(d.StoreTime.Seconds())
		}
	}
	if d.Domain == nil {
		m.dm.unknown.countUnmatched(d.Unmatched)
		return
	}
	ds := cm.domains[d.Domain.Name]
	if d.Unmatched > 0 {
		ds.countUnmatched(d.Unmatched)
	}
	if len(d.Items) > 0 {
		m.countVerdicts(cm, d)
		countReservations(cm, d)
	}
	if d.Response != nil && d.Response.Never {
		ds.countImpossible()
	}
}

// countVerdicts counts the verdict on each item of d and samples how full
// it left its key.
func (m *Metrics) countVerdicts(cm *configMetrics, d *service.Decision) {
	var buf *[]byte   // for per-value labels: from the pool when a limit has them
	var fullNow int64 // the fullness clock, read once when a sample needs it
	for i := range d.Items {
		it, r, l := &d.Items[i], &d.Results[i], d.Limits[i]
		c := cm.metricsOf(d.Domain, l)
		verdict := resultOver
		switch {
		case r.Admitted:
			verdict = resultOK
		case it.Shadow:
			verdict = resultShadowOver
		}
		if c.values == nil {
			c.count(verdict, nil, nil)
		} else {
			if buf == nil {
				buf = m.labels.Get().(*[]byte)
			}
			*buf = c.count(verdict, d.Entries[d.Owners[i]], *buf)
		}
		m.full.sample(cm, d.Domain, c, l, it, r, &fullNow)
	}
	if buf != nil {
		m.labels.Put(buf)
	}
}

// Cleared implements service.Observer: the reset and its counters, whose
// keys leave the fullness sample.
func (m *Metrics) Cleared(state any, c *service.Cleared) {
	m.full.forget(state.(*configMetrics), c)
	m.m.resets.Inc()
	m.m.resetCounters.Add(float64(c.Counters))
}
