package lease

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the store's metrics, read from Stats at each scrape:
// rls_lease_*. The caller registers them.
func (s *Store) Collectors() []prometheus.Collector {
	counter := func(name, help string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(s.Stats())) })
	}
	gauge := func(name, help string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return float64(f(s.Stats())) })
	}
	return []prometheus.Collector{
		counter("rls_lease_slices_taken_total", "Slices of leased limits taken from the store (each counted there when taken).", func(st Stats) uint64 { return st.SlicesTaken }),
		counter("rls_lease_hits_taken_total", "Hits of the slices taken.", func(st Stats) uint64 { return st.HitsTaken }),
		counter("rls_lease_hits_local_total", "Hits admitted from slices, decided in process without a store round trip.", func(st Stats) uint64 { return st.HitsLocal }),
		counter("rls_lease_hits_given_back_total", "Unused hits of slices released to the store (the counter went quiet, a bucket slice's lifetime ended, shutdown).", func(st Stats) uint64 { return st.HitsReleased }),
		counter("rls_lease_slices_lost_total", "Slices whose unused hits lapsed, not released: held when their window ended (too close to its end to release), a limit lowered, the counter reset, or a release failed. They count in their window and no longer.", func(st Stats) uint64 { return st.SlicesLapsed }),
		counter("rls_lease_hits_lost_total", "The unused hits of the slices that lapsed.", func(st Stats) uint64 { return st.HitsLapsed }),
		counter("rls_lease_take_errors_total", "Takes of a slice that failed (the requests go to the store meanwhile).", func(st Stats) uint64 { return st.TakeErrors }),
		gauge("rls_lease_hits_held", "Unused hits held in slices now: counted in the store, not yet admitted here.", func(st Stats) uint64 { return st.HitsHeld }),
		gauge("rls_lease_counters", "Counters of leased limits this process keeps a slice record of.", func(st Stats) uint64 { return st.CountersLeased }),
	}
}
