package lease

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/redisstore"
	"github.com/rlsproject/rls/internal/redistest"
)

// TestConformance: the lease layer is a store like any other: over the
// memory store, and over the Redis store as rls serve runs it, it passes
// the conformance suite (whose limits are not leased: the layer must
// decide, peek, reset and ping them exactly as its inner store does).
func TestConformance(t *testing.T) {
	t.Run("memstore", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
			inner := memstore.New(memstore.Options{Now: now})
			s := New(inner, Options{Now: now})
			t.Cleanup(func() {
				s.Close()
				inner.Close()
			})
			return s
		})
	})
	t.Run("redisstore", func(t *testing.T) {
		srv := redistest.Start(t)
		storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
			inner, err := redisstore.New(redisstore.Options{URL: srv.URL(), Now: now, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := inner.Warm(ctx); err != nil {
				t.Fatal(err)
			}
			s := New(inner, Options{Now: now, StoreTimeout: inner.DecisionTimeout()})
			t.Cleanup(func() {
				s.Close()
				inner.Close()
			})
			return s
		})
	})
}
