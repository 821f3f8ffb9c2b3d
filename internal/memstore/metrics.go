package memstore

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the store's metrics, read from Stats at each scrape:
// rls_memstore_counters and rls_memstore_bytes. The caller registers them.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_memstore_counters",
			Help: "Counters held by the memory store.",
		}, func() float64 { n, _ := s.Stats(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_memstore_bytes",
			Help: "Bytes the memory store's counters are counted as taking (bounded by --memory-limit).",
		}, func() float64 { _, b := s.Stats(); return float64(b) }),
	}
}
