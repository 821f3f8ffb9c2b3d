package redisstore

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the store's metrics, read from Stats at each scrape:
// rls_redis_* and rls_deny_cache_hits_total. The caller registers them.
func (s *Store) Collectors() []prometheus.Collector {
	counter := func(name, help string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(s.Stats())) })
	}
	return []prometheus.Collector{
		counter("rls_redis_decisions_total", "Requests decided by Redis scripts.", func(st Stats) uint64 { return st.Decisions }),
		counter("rls_redis_scripts_total", "Decide functions called in Redis (FCALL); decisions/scripts is the batching within one call.", func(st Stats) uint64 { return st.Scripts }),
		counter("rls_redis_round_trips_total", "Pipelines sent to Redis; decisions/round trips is the batching.", func(st Stats) uint64 { return st.RoundTrips }),
		counter("rls_deny_cache_hits_total", "Requests denied from the denial cache without a round trip.", func(st Stats) uint64 { return st.CacheHits }),
		counter("rls_redis_releases_total", "Reservations released (on cluster masters, or the per-second Redis and the other) because another node denied the request.", func(st Stats) uint64 { return st.Releases }),
		counter("rls_redis_errors_total", "Store calls that failed.", func(st Stats) uint64 { return st.Errors }),
		counter("rls_redis_expired_total", "Requests Redis did not decide because they reached it after their deadline (nothing consumed).", func(st Stats) uint64 { return st.Expired }),
		counter("rls_redis_given_back_total", "Decisions whose replies came after their callers stopped waiting, and whose consumption was given back.", func(st Stats) uint64 { return st.GivenBack }),
		counter("rls_redis_indeterminate_total", "Requests that may have consumed without rls answering them and that could not be given back (no reply, a late reply without undo log, a failed give-back).", func(st Stats) uint64 { return st.Indeterminate }),
	}
}
