package service

import (
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/overrides"
)

// Overrides are the runtime overrides of the config's limits: what an
// operator sets through /admin/overrides (internal/overrides's Keeper).
// They replace requests_per_unit (and burst) of the limits they match in
// the resolve step, on the same counters, so that the store sees only the
// rules to count with.
//
// A request's own limit (the `limit` of a RateLimitService descriptor,
// what Envoy Gateway's fromMetadata sends) wins over them: it names a
// counter of its own, which no configured limit counts on, and the
// config is not consulted for that descriptor.
type Overrides interface {
	// Bind is called with each config before it becomes current.
	Bind(cfg *config.Config)
	// Table returns the overrides in force on cfg, nil when there are none.
	// It must not allocate but rarely (an expiry).
	Table(cfg *config.Config) *overrides.Table
}

// overridesOf returns the overrides in force on cfg.
func (s *Service) overridesOf(cfg *config.Config) *overrides.Table {
	if s.overrides == nil {
		return nil
	}
	return s.overrides.Table(cfg)
}
