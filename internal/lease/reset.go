package lease

import (
	"context"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// Ping implements engine.Store: the inner store's, for readiness.
func (s *Store) Ping(ctx context.Context) error { return s.inner.Ping(ctx) }

// Reset implements engine.Store: this process's slices of the items'
// counters are dropped (their hits were counted in the store's state,
// which the inner store's Reset clears), then the inner store resets the
// counters. Slices that other processes hold are theirs until they are
// spent or lapse: right after a reset, a counter may admit up to what
// other processes held beyond its limit (the README says so).
func (s *Store) Reset(ctx context.Context, items []engine.Item) (int, error) {
	for i := range items {
		c := s.lookup(items[i].Desc, items[i].Rule)
		if c == nil {
			continue
		}
		c.mu.Lock()
		s.ledger.Lapse(&c.grant)
		c.remaining, c.remainingUntil = 0, time.Time{}
		c.mu.Unlock()
	}
	return s.inner.Reset(ctx, items)
}
