package redisstore

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the store's metrics, read from Stats and
// DenyCacheStats at each scrape: rls_redis_* and rls_deny_cache_* (0 when
// the denial cache is off). The caller registers them.
func (s *Store) Collectors() []prometheus.Collector {
	counter := func(name, help string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(s.Stats())) })
	}
	cache := func(f func(DenyCacheStats) uint64) func() float64 {
		return func() float64 {
			st, _ := s.DenyCacheStats()
			return float64(f(st))
		}
	}
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rls_deny_cache_lookups_total", Help: "Requests that asked the denial cache (answered from it or sent to Redis)."},
			cache(func(st DenyCacheStats) uint64 { return st.Lookups })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rls_deny_cache_entries", Help: "Denials held by the denial cache."},
			cache(func(st DenyCacheStats) uint64 { return st.Entries })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rls_deny_cache_evicted_total", Help: "Denials dropped from the full denial cache while they still held (--deny-cache's bound)."},
			cache(func(st DenyCacheStats) uint64 { return st.Evicted })),
		counter("rls_redis_decisions_total", "Requests decided by Redis scripts.", func(st Stats) uint64 { return st.Decisions }),
		counter("rls_redis_scripts_total", "Decide functions called in Redis (FCALL); decisions/scripts is the batching within one call.", func(st Stats) uint64 { return st.Scripts }),
		counter("rls_redis_round_trips_total", "Pipelines sent to Redis; decisions/round trips is the batching.", func(st Stats) uint64 { return st.RoundTrips }),
		counter("rls_deny_cache_hits_total", "Requests denied from the denial cache without a round trip.", func(st Stats) uint64 { return st.CacheHits }),
		counter("rls_redis_releases_total", "Reservations released (on cluster masters, or the per-second Redis and the other) because another node denied the request.", func(st Stats) uint64 { return st.Releases }),
		counter("rls_redis_errors_total", "Store calls that failed.", func(st Stats) uint64 { return st.Errors }),
		counter("rls_redis_expired_total", "Requests Redis did not decide because they reached it after their deadline (nothing consumed).", func(st Stats) uint64 { return st.Expired }),
		counter("rls_redis_resent_total", "Requests sent again because they had reached Redis after their deadline (nothing consumed) and their callers still waited.", func(st Stats) uint64 { return st.Resent }),
		counter("rls_redis_given_back_total", "Decisions whose replies came after their callers stopped waiting, and whose consumption was given back.", func(st Stats) uint64 { return st.GivenBack }),
		counter("rls_redis_indeterminate_total", "Requests that may have consumed without rls answering them and that could not be given back (no reply, a late reply without undo log, a failed give-back).", func(st Stats) uint64 { return st.Indeterminate }),
	}
}
