package service

import (
	"math"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
)

// ReferenceStats configures envoyproxy/ratelimit's per-limit stats, named
// as its Prometheus mapping (statsd_exporter) names them, so that
// dashboards and alerts built on the reference keep working:
// ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}
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
// configured stats key, the rest counted under key1="_other". Safe for
// concurrent use.
type refStats struct {
	ratio                                float64
	maxValues                            int
	total, over, near, within, shadow    *prometheus.CounterVec // domain, key1, key2
	globalShadow, loadSuccess, loadError prometheus.Counter
	mu                                   sync.Mutex
	values                               map[string]map[string]bool // request-valued label sets by configured stats key
}

func newRefStats(o *ReferenceStats, reg prometheus.Registerer, maxValues int) *refStats {
	if maxValues <= 0 {
		maxValues = DefaultMaxValueSeries
	}
	r := &refStats{ratio: o.NearLimitRatio, maxValues: maxValues, values: make(map[string]map[string]bool)}
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
	r.globalShadow = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_global_shadow_mode", Help: "Answers turned from OVER_LIMIT to OK by SHADOW_MODE."})
	r.loadSuccess = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success", Help: "Config loads that succeeded."})
	r.loadError = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error", Help: "Config loads that failed (the previous config stays in use)."})
	if reg != nil {
		reg.MustRegister(r.total, r.over, r.near, r.within, r.shadow, r.globalShadow, r.loadSuccess, r.loadError)
	}
	return r
}

// record counts the verdict r on item it of a request descriptor with
// entries, which matched node (nil for a request override), in domain.
// The counter's state before and after the hits is read from the verdict:
// admitted, the limit less what remains is the count after; denied, before.
func (rs *refStats) record(domain string, node *descriptors.Descriptor, entries []descriptors.Entry, it *engine.Item, r *engine.Result) {
	if it.Refund {
		return
	}
	key1, key2 := rs.labels(domain, node, entries)
	lim := uint64(it.Limit.RequestsPerUnit)
	near := uint64(math.Floor(float64(lim) * rs.ratio))
	hits := it.Hits
	var before, after uint64
	if r.Admitted {
		after = lim - min(r.Remaining, lim)
		before = after - min(hits, after)
	} else {
		before = lim - min(r.Remaining, lim)
		after = before + hits
	}
	rs.total.WithLabelValues(domain, key1, key2).Add(float64(hits))
	if after > lim {
		overHits := hits
		if before < lim {
			overHits = after - lim
			if d := lim - max(near, before); d > 0 {
				rs.near.WithLabelValues(domain, key1, key2).Add(float64(d))
			}
		}
		rs.over.WithLabelValues(domain, key1, key2).Add(float64(overHits))
		if it.Shadow {
			rs.shadow.WithLabelValues(domain, key1, key2).Add(float64(overHits))
		}
		return
	}
	rs.within.WithLabelValues(domain, key1, key2).Add(float64(hits))
	if after > near {
		rs.near.WithLabelValues(domain, key1, key2).Add(float64(after - max(near, before)))
	}
}

// labels returns key1 and key2 of the reference's stats key for entries
// that matched node: per level the key, then "_" and the configured value
// (a wildcard's pattern) when there is one, or the request's value at
// every level under detailed_metric, at a level with value_to_metric, and
// for a request override.
func (rs *refStats) labels(domain string, node *descriptors.Descriptor, entries []descriptors.Entry) (string, string) {
	parts := make([]string, 0, len(entries))
	var config []string // the same key without request values
	fromRequest := node == nil
	var levels [MaxEntries]*descriptors.Descriptor
	for n := node; n != nil; n = n.Parent {
		levels[n.Depth] = n
	}
	for i, e := range entries {
		if node == nil {
			part := e.Key
			if e.Value != "" {
				part += "_" + e.Value
			}
			parts = append(parts, part)
			continue
		}
		n := levels[i]
		configured := n.Key
		if n.Value != "" {
			configured += "_" + n.Value
		}
		config = append(config, configured)
		if node.DetailedMetric || n.ValueToMetric {
			fromRequest = true
			parts = append(parts, n.Key+"_"+e.Value)
			continue
		}
		parts = append(parts, configured)
	}
	if fromRequest && !rs.admit(domain, config, parts) {
		return OtherSeries, ""
	}
	return parts[0], strings.Join(parts[1:], ".")
}

// admit reports whether the request-valued label set parts of configured
// stats key config (nil for overrides: one budget per domain) has a
// series, making room for it while there are fewer than maxValues.
func (rs *refStats) admit(domain string, config, parts []string) bool {
	ck := domain + "\x00" + strings.Join(config, "\x00")
	pk := strings.Join(parts, "\x00")
	rs.mu.Lock()
	defer rs.mu.Unlock()
	set := rs.values[ck]
	if set[pk] {
		return true
	}
	if len(set) >= rs.maxValues {
		return false
	}
	if set == nil {
		set = make(map[string]bool)
		rs.values[ck] = set
	}
	set[pk] = true
	return true
}
