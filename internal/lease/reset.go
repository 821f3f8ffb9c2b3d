package lease

import (
	"context"
	"errors"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

var _ engine.Resetter = (*Store)(nil)

// Reset implements engine.Resetter: this process's slices of the items'
// counters are dropped (their hits were counted in the store's state,
// which the inner store's Reset clears), then the inner store resets the
// counters. Slices that other processes hold are theirs until they are
// spent or lapse: right after a reset, a counter may admit up to what
// other processes held beyond its limit (the README says so).
func (s *Store) Reset(ctx context.Context, items []engine.Item) (int, error) {
	r, ok := s.inner.(engine.Resetter)
	if !ok {
		return 0, errors.New("the store cannot reset counters")
	}
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
	return r.Reset(ctx, items)
}
