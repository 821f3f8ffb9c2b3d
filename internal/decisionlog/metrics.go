package decisionlog

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the log's metrics, read from Stats at each scrape.
func (l *Log) Collectors() []prometheus.Collector {
	counter := func(name, help string, v func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(l.Stats())) })
	}
	return []prometheus.Collector{
		counter("rls_decision_log_records_total", "Records (decisions and resets) the decision log wrote.", func(s Stats) uint64 { return s.Written }),
		counter("rls_decision_log_dropped_total", "Records the decision log dropped because its queue was full (the writer could not keep up); the decisions were not slowed.", func(s Stats) uint64 { return s.Dropped }),
		counter("rls_decision_log_failed_total", "Records lost to a failed write of the decision log.", func(s Stats) uint64 { return s.Failed }),
		counter("rls_decision_log_bytes_total", "Bytes the decision log wrote, headers included.", func(s Stats) uint64 { return s.Bytes }),
		counter("rls_decision_log_rotations_total", "Files of the decision log rotated (renamed PATH.1) once full.", func(s Stats) uint64 { return s.Rotated }),
	}
}
