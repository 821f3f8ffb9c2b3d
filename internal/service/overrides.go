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

// LimitsOf returns the limits that a descriptor of domain whose entries
// matched node in cfg counts with: node's, each as the runtime overrides
// in force on cfg make it. A front end that sizes what it hands out from
// the limits (RLQS's assignments) reads them here. A new slice; nil for a
// nil node.
func (s *Service) LimitsOf(cfg *config.Config, domain string, entries []config.Entry, node *config.Descriptor) []*config.Limit {
	if node == nil {
		return nil
	}
	t := s.overridesOf(cfg)
	out := make([]*config.Limit, len(node.Limits))
	for i, l := range node.Limits {
		out[i] = t.Apply(domain, entries, l)
	}
	return out
}
