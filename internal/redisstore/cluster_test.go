package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

func TestClusterConformance(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	storetest.Run(t, func(t *testing.T, now func() time.Time) engine.Store {
		return newStore(t, Options{ClusterSeeds: c.Seeds(), Now: now})
	})
}

// descsOnDistinctMasters finds n descriptor identities whose counters live
// on n different masters.
func descsOnDistinctMasters(t *testing.T, c *redistest.Cluster, s *Store, l *descriptors.Limit, n int) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	for i := 0; len(out) < n && i < 1000; i++ {
		d := fmt.Sprintf("d/user=u%d", i)
		m := c.Master(c.KeySlot(s.base(&engine.Item{Desc: d, Limit: l})))
		if !seen[m.Addr()] {
			seen[m.Addr()] = true
			out = append(out, d)
		}
	}
	if len(out) < n {
		t.Fatalf("found descriptors on only %d masters", len(out))
	}
	return out
}

// TestClusterAllOrNothingAcrossMasters: a request whose descriptors live on
// three masters, one of which denies, consumes nothing on the other two.
func TestClusterAllOrNothingAcrossMasters(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{ClusterSeeds: c.Seeds(), Now: clock.Now})
	windows := []*descriptors.Limit{
		storetest.Limit(descriptors.FixedWindow, 5, time.Minute, 0),
		storetest.Limit(descriptors.TokenBucket, 5, time.Minute, 5),
		storetest.Limit(descriptors.SlidingLog, 5, time.Minute, 0),
	}
	descs := descsOnDistinctMasters(t, c, s, windows[0], 3)
	var items []engine.Item
	for _, d := range descs {
		for _, l := range windows {
			items = append(items, engine.Item{Desc: d, Limit: l, Hits: 1})
		}
	}
	strict := storetest.Limit(descriptors.FixedWindow, 1, time.Minute, 0)
	strict.ID += ":6:strict"
	ctx := context.Background()
	results := make([]engine.Result, len(items)+1)
	// Use up the strict limit of the third descriptor.
	if ok, err := s.Apply(ctx, []engine.Item{{Desc: descs[2], Limit: strict, Hits: 1}}, results); err != nil || !ok {
		t.Fatalf("setup: %v %v", ok, err)
	}
	withStrict := append(append([]engine.Item{}, items...), engine.Item{Desc: descs[2], Limit: strict, Hits: 1})
	for i := range 3 {
		ok, err := s.Apply(ctx, withStrict, results)
		if err != nil || ok {
			t.Fatalf("request %d across 3 masters with one denying: %v %v, want denied", i, ok, err)
		}
	}
	s.releasing.Wait() // releases run in the background
	if s.Stats().Releases == 0 {
		t.Error("no reservation was released")
	}
	// Nothing was consumed: every window still has all 5 on every master.
	look := make([]engine.Item, len(items))
	for i := range items {
		look[i] = items[i]
		look[i].Hits = 0
	}
	if ok, err := s.Apply(ctx, look, results); err != nil || !ok {
		t.Fatalf("look: %v %v", ok, err)
	}
	for i := range look {
		if results[i].Remaining != 5 {
			t.Errorf("%s %s: remaining %d after denied requests, want 5 (nothing consumed)", look[i].Desc, look[i].Limit.Algorithm, results[i].Remaining)
		}
	}
	// Admitted across masters: consumed everywhere.
	if ok, err := s.Apply(ctx, items, results); err != nil || !ok {
		t.Fatalf("request without the strict limit: %v %v, want admitted", ok, err)
	}
	for i := range items {
		if results[i].Remaining != 4 {
			t.Errorf("%s %s: remaining %d, want 4", items[i].Desc, items[i].Limit.Algorithm, results[i].Remaining)
		}
	}
}
