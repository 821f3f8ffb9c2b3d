package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/testpki"
)

// oneHit is a request of one hit on a fixed window of a million an hour:
// admitted whenever Redis decides it.
func oneHit(desc string) []engine.Item {
	return []engine.Item{{Desc: desc, Limit: storetest.Limit(descriptors.FixedWindow, 1_000_000, time.Hour, 0), Hits: 1}}
}

// TestTLSFirstCallAfterReady: a store started against Redis over TLS, warmed
// and ready (Ping), decides its first call within the default 10 ms store
// timeout, at each of 12 cold starts. The pipelines took their connections
// from go-redis's pipeline pool, which Warm had not connected: the first
// call dialed and made its TLS handshake after its deadline in Redis's
// clock was set, and 4 of 12 cold starts failed with "no reply within the
// store timeout", once after /readyz said 200.
func TestTLSFirstCallAfterReady(t *testing.T) {
	files := testpki.New(t)
	srv := redistest.StartWith(t, redistest.Config{TLS: files})
	for i := range 12 {
		s, err := New(Options{URL: "rediss://" + srv.Addr() + "/0", CAFile: files.CA}) // the default store timeout, 10 ms
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.Warm(ctx); err != nil {
			t.Fatalf("cold start %d: Warm: %v", i, err)
		}
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("cold start %d: Ping after Warm: %v", i, err)
		}
		cancel()
		if _, err := s.Apply(context.Background(), oneHit("d/k=first"), make([]engine.Result, 1)); err != nil {
			t.Errorf("cold start %d: the first call after ready: %v", i, err)
		}
		s.Close()
	}
}

// TestRefusedRedisFailsFast: with nothing listening at Redis's address
// (connection refused) and a store timeout of 2 s, every call fails within
// a tenth of the timeout, and so does Ping. go-redis dialed five times with
// 100 ms pauses inside each call: 0.41 s per call.
func TestRefusedRedisFailsFast(t *testing.T) {
	s := newStore(t, Options{URL: "redis://" + servetest.Addr(t) + "/0", Timeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Warm(ctx); err == nil {
		t.Fatal("Warm with nothing listening succeeded")
	}
	bound := s.opts.Timeout / 10
	for i := range 20 {
		start := time.Now()
		_, err := s.Apply(context.Background(), oneHit("d/k=refused"), make([]engine.Result, 1))
		if d := time.Since(start); err == nil || d > bound {
			t.Errorf("call %d with Redis refusing connections: %v after %s; want an error well before the 2 s store timeout (within %s)", i, err, d, bound)
		}
	}
	start := time.Now()
	if err := s.Ping(ctx); err == nil || time.Since(start) > bound {
		t.Errorf("Ping with Redis refusing connections: %v after %s; want an error within %s", err, time.Since(start), bound)
	}
}
