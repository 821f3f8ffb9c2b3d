package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

// The store's part of a fault: what a reply that came after its caller
// stopped waiting consumed is given back (release.lua), up to Close. What
// the driver does under faults (deadlines, resends, cuts, pauses) is
// tested in redisconn with a stub function.

// everyAlgorithm returns one item per algorithm, each on its own counter of
// desc, with a limit of 100 (burst 100).
func everyAlgorithm(desc string, hits uint64) []engine.Item {
	var items []engine.Item
	for _, alg := range storetest.Algorithms() {
		burst := uint32(0)
		if alg == engine.TokenBucket {
			burst = 100
		}
		items = append(items, engine.Item{Desc: desc, Rule: storetest.Rule(alg, 100, time.Hour, burst), Hits: hits})
	}
	return items
}

// lookFull fails unless every counter of items still admits its whole limit.
// The look is asked again until Redis decides it (for 10 s at most): on a
// machine busy with other tests even a sound round trip can miss a short
// store timeout. A look that missed has an outcome of its own (expired,
// given back): when one did, lookFull waits until it is counted, so that a
// test that counts outcomes after lookFull counts its own requests only.
func lookFull(t *testing.T, s *Store, items []engine.Item, what string) {
	t.Helper()
	look := make([]engine.Item, len(items))
	for i := range items {
		look[i] = items[i]
		look[i].Hits = 0
	}
	results := make([]engine.Result, len(look))
	missed := 0
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := s.Apply(context.Background(), look, results)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: a look, asked for 10 s: %v", what, err)
		}
		missed++
	}
	if missed > 0 {
		t.Logf("%s: %d looks missed the store timeout before one was decided", what, missed)
		settle(t, s)
	}
	for i, r := range results {
		if l := look[i].Rule; r.Remaining != uint64(l.Limit) {
			t.Errorf("%s: %s remaining %d, want the whole limit %d (a request rls did not answer consumed)", what, l.Algorithm(), r.Remaining, l.Limit)
		}
	}
}

// starvedBound is the pipeline bound of the tests that count each
// request's outcome: on a machine starved by the race detector and other
// tests, a reply can come after the default 100 ms, and the store then
// rightly counts it as indeterminate.
const starvedBound = time.Second

// settle waits for what the store does after its callers have their
// answers: late replies read (a pipeline is waited for its bound at most)
// and given back.
func settle(t *testing.T, s *Store) {
	t.Helper()
	time.Sleep(s.backends[0].conn.MaxWait())
	s.releasing.Wait()
}

// behindProxy returns a fault proxy in front of srv and a store through it
// with opts (its URL set).
func behindProxy(t *testing.T, srv *redistest.Server, opts Options) (*redistest.FaultProxy, *Store) {
	t.Helper()
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	opts.URL = "redis://" + proxy.Addr() + "/0"
	return proxy, newStore(t, opts)
}

// TestLateReplyGivenBack: replies that come after their callers stopped
// waiting are given back: admissions, and denials whose hits count when
// denied. With a 240 ms store timeout, requests reach Redis 150 ms after
// they leave, in the last half of their deadline (so they are decided with
// their undo logs), and replies take 240 ms back, past the callers' wait
// (deadline plus half a timeout: 360 ms). Each margin is 30 ms (10 ms, at a
// third of these timings, failed 2 of 8 runs on a loaded machine). While
// the fault lasts, the bound of Redis's clock lead (read from replies that
// take 240 ms back) drops by as much, so some requests are sent with an
// earlier deadline and expire instead: never later, never consuming.
func TestLateReplyGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name        string
		hits        uint64
		countDenied bool
	}{
		{"admitted", 3, false},
		{"denied, its hits counted", 101, true}, // over every limit of 100
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy, s := behindProxy(t, srv, Options{Prefix: "late:" + tc.name + ":", Timeout: lateTimeout, minPipelineBound: starvedBound})
			checkLateRepliesGivenBack(t, proxy, s, tc.hits, tc.countDenied)
		})
	}
}

// lateTimeout is the store timeout of checkLateRepliesGivenBack's timings.
const lateTimeout = 240 * time.Millisecond

// checkLateRepliesGivenBack sends requests of hits (counted when denied,
// with countDenied) through proxy to s (whose timeout is lateTimeout) with
// TestLateReplyGivenBack's timings, and checks that each was given back or
// expired, none indeterminate, every counter whole afterwards.
func checkLateRepliesGivenBack(t *testing.T, proxy *redistest.FaultProxy, s *Store, hits uint64, countDenied bool) {
	t.Helper()
	items := everyAlgorithm("d/k=late", hits)
	for i := range items {
		items[i].CountDenied = countDenied
	}
	lookFull(t, s, items, "before the fault")

	// Outcomes of the n requests only (a look that missed its deadline has
	// its own).
	st0 := s.Stats()
	proxy.SetLatency(150 * time.Millisecond)
	proxy.SetReplyDelay(90 * time.Millisecond)
	results := make([]engine.Result, len(items))
	const n = 12
	for i := range n {
		if _, err := s.Apply(context.Background(), items, results); err == nil {
			t.Fatalf("request %d: answered within the wait over 390 ms of round trip", i)
		}
	}
	proxy.Heal()
	settle(t, s)
	st := s.Stats()
	givenBack, expired, indeterminate := st.GivenBack-st0.GivenBack, st.Expired-st0.Expired, st.Indeterminate-st0.Indeterminate
	if givenBack+expired != n || givenBack == 0 || indeterminate != 0 {
		t.Errorf("Stats() = %+v (before the requests: %+v), want %d given back or expired, some given back, none indeterminate", st, st0, n)
	}
	lookFull(t, s, items, "after late replies")
}

// TestCloseGivesBackLateReplies: a store closed while a late reply is on
// its way (rls shutting down during a slow Redis) reads it and gives it
// back before it stops: the timings of TestLateReplyGivenBack, and Close as
// soon as the caller has its error.
func TestCloseGivesBackLateReplies(t *testing.T) {
	srv := redistest.Start(t)
	proxy, s := behindProxy(t, srv, Options{Timeout: 240 * time.Millisecond, minPipelineBound: starvedBound})
	items := everyAlgorithm("d/k=close", 3)
	lookFull(t, s, items, "before the fault")
	proxy.SetLatency(150 * time.Millisecond)
	proxy.SetReplyDelay(90 * time.Millisecond)
	results := make([]engine.Result, len(items))
	if _, err := s.Apply(context.Background(), items, results); err == nil {
		t.Fatal("answered within the wait over 390 ms of round trip")
	}
	st0 := s.Stats()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.GivenBack+st.Expired == st0.GivenBack+st0.Expired || st.Indeterminate != st0.Indeterminate {
		t.Errorf("Stats() after Close = %+v (before: %+v), want the request given back or expired, none indeterminate", st, st0)
	}
	proxy.Heal()
	lookFull(t, newStore(t, Options{URL: srv.URL()}), items, "after Close")
}
