package service

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// ReferenceStats configures envoyproxy/ratelimit's per-limit stats, named
// as its Prometheus mapping (statsd_exporter) names them, so that
// dashboards and alerts built on the reference keep working:
// ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode,over_limit_with_local_cache}
// with the labels domain, key1 (the first level of the stats key: key, or
// key_value) and key2 (the deeper levels joined with '.'; empty for one
// level); ratelimit_service_global_shadow_mode; and
// ratelimit_service_config_load_{success,error}.
type ReferenceStats struct {
	// NearLimitRatio is the share of a limit above which hits count as
	// near_limit (NEAR_LIMIT_RATIO); 0 means 0.8, the reference's default.
	NearLimitRatio float64
}

// refStats are the reference's stats. Label values come from the config
// (the key, and the configured value or wildcard pattern, per level), and
// from request values only where the reference puts them (detailed_metric,
// value_to_metric, request overrides), at most maxValues label sets per
// configured stats key, the rest counted under key1="_other". As
// rls_decisions_total, a stats key's series are made when it first counts
// and deleted when a reload drops it. Safe for concurrent use.
type refStats struct {
	ratio                                float32 // NEAR_LIMIT_RATIO, a float32 in the reference
	maxValues                            int
	total, over, near, within, shadow    *prometheus.CounterVec // domain, key1, key2
	overCached                           *prometheus.CounterVec // over_limit_with_local_cache
	globalShadow, loadSuccess, loadError prometheus.Counter

	// mu orders the making of series against their deletion by a reload
	// (as metrics.mu).
	mu     sync.Mutex
	fixed  map[refKey]*refFixed  // the current config's stats keys without request values
	values map[string]*refValues // the current config's stats keys with request values, by refValuesKey
}

// refKey is the labels of one set of the reference's series.
type refKey struct{ domain, key1, key2 string }

// refSeries are the counters of one refKey.
type refSeries struct{ total, over, near, within, shadow, overCached prometheus.Counter }

// refFixed is a stats key whose labels come from the config alone.
type refFixed struct {
	key     refKey
	series  atomic.Pointer[refSeries]
	removed bool // guarded by refStats.mu: a reload dropped key
}

// refValues are the series of a stats key with request values: at most
// maxValues label sets, then the domain's _other series.
type refValues struct {
	domain  string
	mu      sync.RWMutex
	series  map[string]*refSeries // by the request's label parts, joined by NUL
	keys    []refKey              // of series, to delete them
	removed bool                  // guarded by refStats.mu and mu
}

// refConfig is what a loaded config's requests count into.
type refConfig struct {
	byLimit  []*refNode            // by Limit.Index
	override map[string]*refValues // by domain
}

// refNode is the stats key of a configured node: fixed, or values (then
// the node's levels say which hold request values).
type refNode struct {
	fixed  *refFixed
	values *refValues
	levels []refLevel // the node's path, from the top
}

// refLevel is one level of a stats key: its key, its part from the config
// (the key, "_" and the configured value when there is one), and whether
// the request's value goes in its place (detailed_metric, value_to_metric).
type refLevel struct {
	key, configured string
	fromRequest     bool
}

// refLevels returns node n's levels, from the top.
func refLevels(n *config.Descriptor) []refLevel {
	levels := make([]refLevel, n.Depth+1)
	for l := n; l != nil; l = l.Parent {
		part := l.Key
		if l.Value != "" {
			part += "_" + l.Value
		}
		levels[l.Depth] = refLevel{key: l.Key, configured: part, fromRequest: n.DetailedMetric || l.ValueToMetric}
	}
	return levels
}

func newRefStats(o *ReferenceStats, reg prometheus.Registerer, maxValues int) *refStats {
	if maxValues <= 0 {
		maxValues = DefaultMaxValueSeries
	}
	r := &refStats{ratio: float32(o.NearLimitRatio), maxValues: maxValues, fixed: make(map[refKey]*refFixed), values: make(map[string]*refValues)}
	if r.ratio <= 0 {
		r.ratio = 0.8
	}
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name, Help: help + " (envoyproxy/ratelimit's stat, by its stats key)."},
			[]string{"domain", "key1", "key2"})
	}
	r.total = vec("total_hits", "Hits asked for")
	r.over = vec("over_limit", "Hits over the limit")
	r.near = vec("near_limit", "Hits above NEAR_LIMIT_RATIO of the limit and within it")
	r.within = vec("within_limit", "Hits within the limit")
	r.shadow = vec("shadow_mode", "Hits over a shadow_mode limit, let through")
	// The reference's Prometheus mapping has no line for it: this is the
	// name and labels its other stats get.
	r.overCached = vec("over_limit_with_local_cache", "Hits over the limit answered from the denial cache (the reference's local cache), also in over_limit")
	r.globalShadow = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_global_shadow_mode", Help: "Answers turned from OVER_LIMIT to OK by SHADOW_MODE."})
	r.loadSuccess = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success", Help: "Config loads that succeeded."})
	r.loadError = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error", Help: "Config loads that failed (the previous config stays in use)."})
	if reg != nil {
		reg.MustRegister(r.total, r.over, r.near, r.within, r.shadow, r.overCached, r.globalShadow, r.loadSuccess, r.loadError)
	}
	return r
}

// vecs are the counter vectors of a refSeries, in its field order.
func (rs *refStats) vecs() [6]*prometheus.CounterVec {
	return [6]*prometheus.CounterVec{rs.total, rs.over, rs.near, rs.within, rs.shadow, rs.overCached}
}

// makeSeries returns the counters of k.
func (rs *refStats) makeSeries(k refKey) *refSeries {
	c := func(v *prometheus.CounterVec) prometheus.Counter { return v.WithLabelValues(k.domain, k.key1, k.key2) }
	return &refSeries{total: c(rs.total), over: c(rs.over), near: c(rs.near), within: c(rs.within), shadow: c(rs.shadow), overCached: c(rs.overCached)}
}

func (rs *refStats) deleteSeries(k refKey) {
	for _, v := range rs.vecs() {
		v.DeleteLabelValues(k.domain, k.key1, k.key2)
	}
}

// forConfig returns the stats keys of cfg's limits and overrides, keeping
// the series of the keys that the previous config had too, and deletes the
// series of the keys that cfg has not.
func (rs *refStats) forConfig(cfg *config.Config) *refConfig {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rc := &refConfig{byLimit: make([]*refNode, len(cfg.Limits())), override: make(map[string]*refValues, len(cfg.Domains()))}
	fixed := make(map[refKey]*refFixed)
	values := make(map[string]*refValues)
	valuesOf := func(key, domain string) *refValues {
		v := values[key]
		if v == nil {
			if v = rs.values[key]; v == nil {
				v = &refValues{domain: domain, series: make(map[string]*refSeries)}
			}
			values[key] = v
		}
		return v
	}
	for _, d := range cfg.Domains() {
		rc.override[d.Name] = valuesOf(d.Name, d.Name)
		nodes := make(map[*config.Descriptor]*refNode)
		walk(d.Descriptors, func(l *config.Limit) {
			n := nodes[l.Descriptor]
			if n == nil {
				n = &refNode{levels: refLevels(l.Descriptor)}
				configured := make([]string, len(n.levels))
				withValues := false
				for i, lv := range n.levels {
					configured[i], withValues = lv.configured, withValues || lv.fromRequest
				}
				if withValues {
					// The configured key bounds the request-valued sets.
					n.values = valuesOf(d.Name+"\x00"+strings.Join(configured, "\x00"), d.Name)
				} else {
					k := refKey{d.Name, configured[0], strings.Join(configured[1:], ".")}
					if n.fixed = fixed[k]; n.fixed == nil {
						if n.fixed = rs.fixed[k]; n.fixed == nil {
							n.fixed = &refFixed{key: k}
						}
						fixed[k] = n.fixed
					}
				}
				nodes[l.Descriptor] = n
			}
			rc.byLimit[l.Index] = n
		})
	}
	for k, f := range rs.fixed {
		if fixed[k] == nil {
			f.removed = true
			rs.deleteSeries(k)
		}
	}
	for key, v := range rs.values {
		if values[key] == v {
			continue
		}
		v.mu.Lock()
		v.removed = true
		for _, k := range v.keys {
			if k.key1 != OtherSeries {
				rs.deleteSeries(k)
			}
		}
		v.series, v.keys = nil, nil
		v.mu.Unlock()
	}
	// A domain's _other series is shared by its stats keys with values: it
	// goes with the domain.
	for _, v := range rs.values {
		if cfg.Domain(v.domain) == nil {
			rs.deleteSeries(refKey{v.domain, OtherSeries, ""})
		}
	}
	rs.fixed, rs.values = fixed, values
	return rc
}

// record counts the verdict r on item it of a request descriptor with
// entries, in domain, against rc, as the reference splits a request's hits
// by its counter's value before and after them (base_limiter.go).
// The counter's state before and after the hits is read from the verdict:
// admitted, the limit less what remains is the count after; denied, before
// (for a count-denied item, whose hits were charged all the same, what
// remained just before that charge: Remaining is read after it). Of a
// request that names one counter twice, the store reports the state after
// both items: the split of each is then approximate.
func (rs *refStats) record(rc *refConfig, domain string, entries []config.Entry, l *config.Limit, it *engine.Item, r *engine.Result) {
	if it.Refund {
		return
	}
	series := rs.series(rc, domain, entries, l)
	lim := uint64(l.Rule.Limit)
	hits := it.Hits
	if r.Cached {
		// Denied from the denial cache, as the reference's local cache
		// denies: over the limit, whatever the counter (shadow items are
		// never cached).
		series.total.Add(float64(hits))
		series.over.Add(float64(hits))
		series.overCached.Add(float64(hits))
		return
	}
	var before, after uint64
	switch {
	case r.Admitted:
		after = lim - min(r.Remaining, lim)
		before = after - min(hits, after)
	case it.CountDenied:
		before = lim - min(r.RemainingBeforeCharge, lim)
		after = before + hits
	default:
		before = lim - min(r.Remaining, lim)
		after = before + hits
	}
	near := rs.nearThreshold(lim)
	series.total.Add(float64(hits))
	if after > lim {
		overHits := hits
		if before < lim {
			overHits = after - lim
			if d := lim - max(near, before); d > 0 {
				series.near.Add(float64(d))
			}
		}
		series.over.Add(float64(overHits))
		if it.Shadow {
			series.shadow.Add(float64(overHits))
		}
		return
	}
	series.within.Add(float64(hits))
	if after > near {
		series.near.Add(float64(after - max(near, before)))
	}
}

// nearThreshold is the count above which hits are near the limit lim: the
// reference's floor(lim × NEAR_LIMIT_RATIO), computed as it does in float32
// (90 × 0.7 is 63 there, and 62 in float64).
func (rs *refStats) nearThreshold(lim uint64) uint64 {
	return uint64(math.Floor(float64(float32(lim) * rs.ratio)))
}

// discardSeries count what a dropped stats key's late requests decide:
// nothing.
var discardSeries = &refSeries{total: discard, over: discard, near: discard, within: discard, shadow: discard, overCached: discard}

// series returns the counters that item it of a request descriptor with
// entries counts into.
func (rs *refStats) series(rc *refConfig, domain string, entries []config.Entry, l *config.Limit) *refSeries {
	if l.Index < 0 || l.Index >= len(rc.byLimit) {
		// A request override: the request's key and values.
		parts := make([]string, len(entries))
		for i, e := range entries {
			parts[i] = e.Key
			if e.Value != "" {
				parts[i] += "_" + e.Value
			}
		}
		return rs.valueSeries(rc.override[domain], parts)
	}
	n := rc.byLimit[l.Index]
	if n.fixed != nil {
		if s := n.fixed.series.Load(); s != nil {
			return s
		}
		rs.mu.Lock()
		defer rs.mu.Unlock()
		if n.fixed.removed {
			return discardSeries
		}
		if s := n.fixed.series.Load(); s != nil {
			return s
		}
		s := rs.makeSeries(n.fixed.key)
		n.fixed.series.Store(s)
		return s
	}
	parts := make([]string, len(entries))
	for i, e := range entries {
		if lv := n.levels[i]; lv.fromRequest {
			parts[i] = lv.key + "_" + e.Value
		} else {
			parts[i] = lv.configured
		}
	}
	return rs.valueSeries(n.values, parts)
}

// valueSeries returns the series of label parts in v (v's domain's _other
// series once v has maxValues), making them when needed.
func (rs *refStats) valueSeries(v *refValues, parts []string) *refSeries {
	if v == nil {
		return discardSeries
	}
	id := strings.Join(parts, "\x00")
	v.mu.RLock()
	s := v.series[id]
	v.mu.RUnlock()
	if s != nil {
		return s
	}
	rs.mu.Lock() // before v.mu, as in the reload
	defer rs.mu.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.removed {
		return discardSeries
	}
	if s := v.series[id]; s != nil {
		return s
	}
	k := refKey{v.domain, parts[0], strings.Join(parts[1:], ".")}
	if len(v.series) >= rs.maxValues {
		id, k = "", refKey{v.domain, OtherSeries, ""}
		if s := v.series[id]; s != nil {
			return s
		}
	}
	s = rs.makeSeries(k)
	v.series[id] = s
	v.keys = append(v.keys, k)
	return s
}
