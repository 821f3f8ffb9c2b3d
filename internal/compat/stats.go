package compat

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/series"
	"github.com/rlsproject/rls/internal/service"
)

// Stats are envoyproxy/ratelimit's per-limit stats, named as its
// Prometheus mapping (statsd_exporter) names them, so that dashboards and
// alerts built on the reference keep working:
// ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}
// and, with a local cache (the denial cache), over_limit_with_local_cache,
// with the labels domain, key1 (the first level of the stats key: key, or
// key_value) and key2 (the deeper levels joined with '.'; empty for one
// level); ratelimit_service_global_shadow_mode (counted by Answers); and
// ratelimit_service_config_load_{success,error}. A service.Observer.
//
// Label values come from the config (the key, and the configured value or
// wildcard pattern, per level), and from request values only where the
// reference puts them (detailed_metric, value_to_metric, request
// overrides), at most maxValues label sets per configured stats key, the
// rest counted under key1="_other" (one series per domain). As
// rls_decisions_total, a stats key's series are made when it first counts
// and deleted when a reload drops it (series.Family). Safe for concurrent
// use.
type Stats struct {
	ratio                                float32 // NEAR_LIMIT_RATIO, a float32 in the reference
	localCache                           bool    // over_limit_with_local_cache is exported
	globalShadow, loadSuccess, loadError prometheus.Counter
	// counters are ratelimit_service_rate_limit_*{domain,key1,key2}, by
	// the ref* constants.
	counters *series.Family
	labels   sync.Pool // *[]byte: scratch space for request-valued labels
	// all are the collectors above, for a registry of the reference's
	// stats alone (what the StatsD sink reads).
	all []prometheus.Collector
}

var _ service.Observer = (*Stats)(nil)

// The counters of Stats.counters.
const (
	refTotal = iota
	refOver
	refNear
	refWithin
	refShadow
	refOverCached // with StatsOptions.LocalCache only
)

// refConfig is what a loaded config's requests count into.
type refConfig struct {
	byLimit  []*refNode               // by Limit.Index
	override map[string]*series.Group // by domain: request overrides
}

// refNode is the stats key of a configured node: fixed, or values (then
// the node's levels say which hold request values).
type refNode struct {
	fixed  *series.Series
	values *series.Group
	levels []refLevel // the node's path, from the top
}

// refLevel is one level of a stats key: its key, its part from the config
// (the key, "_" and the configured value when there is one), and whether
// the request's value goes in its place (detailed_metric, value_to_metric).
type refLevel struct {
	key, configured string
	fromRequest     bool
}

// withValues reports whether a level of n takes the request's value.
func (n *refNode) withValues() bool {
	for _, lv := range n.levels {
		if lv.fromRequest {
			return true
		}
	}
	return false
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

// StatsOptions configure Stats.
type StatsOptions struct {
	// NearLimitRatio is the share of a limit above which hits count as
	// near_limit (NEAR_LIMIT_RATIO; 0 means 0.8, the reference's default).
	NearLimitRatio float64
	// MaxValues (0: decisionmetrics.DefaultMaxValueSeries) bounds the
	// request-valued label sets of one stats key.
	MaxValues int
	// LocalCache says that the store answers denials from a cache (the
	// reference's LOCAL_CACHE_SIZE_IN_BYTES, rls's denial cache): only
	// then is over_limit_with_local_cache exported, as the reference has
	// no such stat without its cache.
	LocalCache bool
}

// NewStats returns the reference's stats, registered in reg when it is not
// nil.
func NewStats(reg prometheus.Registerer, o StatsOptions) *Stats {
	r := &Stats{ratio: float32(o.NearLimitRatio), localCache: o.LocalCache}
	if r.ratio <= 0 {
		r.ratio = 0.8
	}
	maxValues := o.MaxValues
	if maxValues <= 0 {
		maxValues = decisionmetrics.DefaultMaxValueSeries
	}
	r.labels.New = func() any { return new([]byte) }
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name, Help: help + " (envoyproxy/ratelimit's stat, by its stats key)."},
			[]string{"domain", "key1", "key2"})
	}
	vecs := []*prometheus.CounterVec{ // by the ref* constants
		refTotal:  vec("total_hits", "Hits asked for"),
		refOver:   vec("over_limit", "Hits over the limit"),
		refNear:   vec("near_limit", "Hits above NEAR_LIMIT_RATIO of the limit and within it"),
		refWithin: vec("within_limit", "Hits within the limit"),
		refShadow: vec("shadow_mode", "Hits over a shadow_mode limit, let through"),
	}
	if r.localCache {
		// The reference's Prometheus mapping has no line for it: this is
		// the name and labels its other stats get.
		vecs = append(vecs, vec("over_limit_with_local_cache", "Hits over the limit answered from the denial cache (the reference's local cache), also in over_limit"))
	}
	r.globalShadow = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_global_shadow_mode", Help: "Answers turned from OVER_LIMIT to OK by SHADOW_MODE."})
	r.loadSuccess = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success", Help: "Config loads that succeeded."})
	r.loadError = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error", Help: "Config loads that failed (the previous config stays in use)."})
	for _, v := range vecs {
		r.all = append(r.all, v)
	}
	r.all = append(r.all, r.globalShadow, r.loadSuccess, r.loadError)
	if reg != nil {
		reg.MustRegister(r.all...)
	}
	r.counters = series.New(series.Options{
		Labels:   []string{"domain", "key1", "key2"},
		Counters: vecs,
		Together: true,
		Max:      maxValues,
		// One _other series per domain: every stats key's group has the
		// prefix {domain}.
		Overflow: []string{series.Other, ""},
	})
	return r
}

// forConfig returns the stats keys of cfg's limits and overrides, keeping
// the series of the keys that the previous config had too, and deletes the
// series of the keys that cfg has not. A domain's _other series is shared
// by its stats keys with values: it goes with the domain.
func (rs *Stats) forConfig(cfg *config.Config) *refConfig {
	r := rs.counters.Reload()
	defer r.Commit()
	rc := &refConfig{byLimit: make([]*refNode, len(cfg.Limits())), override: make(map[string]*series.Group, len(cfg.Domains()))}
	for _, d := range cfg.Domains() {
		rc.override[d.Name] = r.Group("", d.Name)
		rc.declare(r, d.Name, d.Descriptors)
	}
	return rc
}

// ForConfig implements service.Observer: the stats keys of cfg.
func (rs *Stats) ForConfig(cfg *config.Config) any { return rs.forConfig(cfg) }

// Reloaded implements service.Observer: config_load_success or _error.
func (rs *Stats) Reloaded(err error) {
	if err != nil {
		rs.loadError.Inc()
		return
	}
	rs.loadSuccess.Inc()
}

// Decided implements service.Observer: each item's hits split as the
// reference splits them (a request the store did not judge has none).
func (rs *Stats) Decided(state any, d *service.Decision) {
	if len(d.Items) == 0 {
		return
	}
	rc := state.(*refConfig)
	buf := rs.labels.Get().(*[]byte)
	for i := range d.Items {
		*buf = rs.record(rc, d.Request.Domain, d.Request.Descriptors[d.Owners[i]].Entries, d.Limits[i], &d.Items[i], &d.Results[i], *buf)
	}
	rs.labels.Put(buf)
}

// Cleared implements service.Observer: the reference has no resets.
func (rs *Stats) Cleared(any, *service.Cleared) {}

// declare sets the stats keys of the limits of nodes and their subtrees,
// in domain.
func (rc *refConfig) declare(r *series.Reload, domain string, nodes []*config.Descriptor) {
	for _, n := range nodes {
		if len(n.Limits) > 0 {
			rn := &refNode{levels: refLevels(n)}
			if rn.withValues() {
				// The configured key bounds the request-valued sets.
				var id []byte
				for _, lv := range rn.levels {
					id = series.AppendLabel(id, lv.configured)
				}
				rn.values = r.Group(string(id), domain)
			} else {
				key2 := make([]byte, 0, 64)
				for i, lv := range rn.levels[1:] {
					if i > 0 {
						key2 = append(key2, '.')
					}
					key2 = append(key2, lv.configured...)
				}
				rn.fixed = r.Series(domain, rn.levels[0].configured, string(key2))
			}
			for _, l := range n.Limits {
				rc.byLimit[l.Index] = rn
			}
		}
		rc.declare(r, domain, n.Children)
	}
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
func (rs *Stats) record(rc *refConfig, domain string, entries []config.Entry, l *config.Limit, it *engine.Item, r *engine.Result, buf []byte) []byte {
	if it.Refund {
		return buf
	}
	s, buf := rc.series(domain, entries, l, buf)
	if s == nil {
		return buf
	}
	lim := uint64(l.Rule.Limit)
	hits := it.Hits
	if r.Cached {
		// Denied from the denial cache, as the reference's local cache
		// denies: over the limit, whatever the counter (shadow items are
		// never cached).
		s.Counter(refTotal).Add(float64(hits))
		s.Counter(refOver).Add(float64(hits))
		if rs.localCache {
			s.Counter(refOverCached).Add(float64(hits))
		}
		return buf
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
	s.Counter(refTotal).Add(float64(hits))
	if after > lim {
		overHits := hits
		if before < lim {
			overHits = after - lim
			if d := lim - max(near, before); d > 0 {
				s.Counter(refNear).Add(float64(d))
			}
		}
		s.Counter(refOver).Add(float64(overHits))
		if it.Shadow {
			s.Counter(refShadow).Add(float64(overHits))
		}
		return buf
	}
	s.Counter(refWithin).Add(float64(hits))
	if after > near {
		s.Counter(refNear).Add(float64(after - max(near, before)))
	}
	return buf
}

// nearThreshold is the count above which hits are near the limit lim: the
// reference's floor(lim × NEAR_LIMIT_RATIO), computed as it does in float32
// (90 × 0.7 is 63 there, and 62 in float64).
func (rs *Stats) nearThreshold(lim uint64) uint64 {
	return uint64(math.Floor(float64(float32(lim) * rs.ratio)))
}

// series returns the series that a request descriptor with entries counts
// into for limit l, in domain (nil when there is none), and buf, scratch
// space for its labels, grown.
func (rc *refConfig) series(domain string, entries []config.Entry, l *config.Limit, buf []byte) (*series.Series, []byte) {
	if l.Index < 0 || l.Index >= len(rc.byLimit) {
		// A request override: the request's key and values.
		g := rc.override[domain]
		if g == nil {
			return nil, buf
		}
		buf = appendRefLabels(buf[:0], nil, entries)
		return g.Get(buf), buf
	}
	n := rc.byLimit[l.Index]
	if n.fixed != nil {
		return n.fixed, buf
	}
	buf = appendRefLabels(buf[:0], n.levels, entries)
	return n.values.Get(buf), buf
}

// appendRefLabels appends to dst the labels key1 and key2 (series.EndLabel)
// of a request descriptor with entries, on a node of levels: per level,
// the request's key and "_" and value where the level takes the request's
// value, else its configured part; with levels nil (a request override),
// the request's key, and "_" and value when there is one, at every level.
// key1 is the first level's part, key2 the others' joined by '.'.
func appendRefLabels(dst []byte, levels []refLevel, entries []config.Entry) []byte {
	start := len(dst)
	for i, e := range entries {
		switch {
		case i == 1:
			dst = series.EndLabel(dst, start)
			start = len(dst)
		case i > 1:
			dst = append(dst, '.')
		}
		switch {
		case levels == nil:
			dst = append(dst, e.Key...)
			if e.Value != "" {
				dst = append(dst, '_')
				dst = append(dst, e.Value...)
			}
		case levels[i].fromRequest:
			dst = append(dst, levels[i].key...)
			dst = append(dst, '_')
			dst = append(dst, e.Value...)
		default:
			dst = append(dst, levels[i].configured...)
		}
	}
	if len(entries) < 2 {
		dst = series.EndLabel(dst, start) // key1
		start = len(dst)
	}
	return series.EndLabel(dst, start) // key2
}
