package overrides

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the keeper's metrics, to register on a registry:
// per domain the overrides held (active or inactive) and the changes by
// operation, never a series per descriptor value; and whether the copy
// held is stale.
func (k *Keeper) Collectors() []prometheus.Collector {
	return []prometheus.Collector{&collector{k: k,
		held: prometheus.NewDesc("rls_overrides",
			"Runtime overrides held, by domain and state: active (applies to limits of the loaded config) or inactive (matches none since a reload; kept).",
			[]string{"domain", "state"}, nil),
		changes: prometheus.NewDesc("rls_override_changes_total",
			"Changes of overrides made by this process, by domain and operation: set and delete through /admin/overrides, expire when one ended by its ttl here.",
			[]string{"domain", "op"}, nil),
		stale: prometheus.NewDesc("rls_overrides_stale",
			"1 while the overrides' store cannot be read: decisions use the last copy read (/readyz says since when).",
			nil, nil),
		readErrors: prometheus.NewDesc("rls_overrides_read_errors_total",
			"Reads of the overrides' store that failed.", nil, nil),
		version: prometheus.NewDesc("rls_overrides_version",
			"The version of the overrides held (the store's counter of changes).", nil, nil),
	}}
}

// collector is a prometheus.Collector of a keeper's metrics, read at each
// scrape.
type collector struct {
	k                                         *Keeper
	held, changes, stale, readErrors, version *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.held, c.changes, c.stale, c.readErrors, c.version} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	type held struct{ active, inactive int }
	byDomain := make(map[string]*held)
	k := c.k
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range k.entries {
		h := byDomain[e.o.Domain]
		if h == nil {
			h = &held{}
			byDomain[e.o.Domain] = h
		}
		if len(e.limits) > 0 {
			h.active++
		} else {
			h.inactive++
		}
	}
	for domain, h := range byDomain {
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(h.active), domain, "active")
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(h.inactive), domain, "inactive")
	}
	for ch2, n := range k.changes {
		ch <- prometheus.MustNewConstMetric(c.changes, prometheus.CounterValue, float64(n), ch2.domain, ch2.op)
	}
	stale := 0.0
	if k.stale != nil {
		stale = 1
	}
	ch <- prometheus.MustNewConstMetric(c.stale, prometheus.GaugeValue, stale)
	ch <- prometheus.MustNewConstMetric(c.readErrors, prometheus.CounterValue, float64(k.syncErr))
	ch <- prometheus.MustNewConstMetric(c.version, prometheus.GaugeValue, float64(k.version))
}
