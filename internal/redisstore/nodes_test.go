package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/redistest"
)

// TestNodes: Nodes names the store's Redis and says it answers; once that
// Redis is stopped, it says why not, for the same address.
func TestNodes(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := s.Nodes(ctx)
	if len(got) != 1 || got[0].Addr != srv.Addr() || got[0].Error != "" || got[0].Seconds <= 0 {
		t.Fatalf("Nodes() = %+v, want %s answering", got, srv.Addr())
	}
	srv.Stop()
	got = s.Nodes(ctx)
	if len(got) != 1 || got[0].Addr != srv.Addr() || got[0].Error == "" {
		t.Errorf("Nodes() with Redis stopped = %+v, want %s and its error", got, srv.Addr())
	}
}
