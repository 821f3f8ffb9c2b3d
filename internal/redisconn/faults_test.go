package redisconn

import (
	"context"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

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
// answers: late replies read (a pipeline is waited for pipelineBound at
// most) and given back.
func settle(t *testing.T, s *Store) {
	t.Helper()
	time.Sleep(pipelineBound(s.opts))
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

// TestShortCallerLongTimeout: a caller that waits less than the store
// timeout and its grace gets a deadline in Redis within its own wait, and
// its requests are decided: with a store timeout of a second and callers
// of 50 ms, every request was refused as past its deadline when the
// deadline was the caller's less the whole timeout's grace (500 ms).
func TestShortCallerLongTimeout(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL(), Timeout: time.Second})
	items := everyAlgorithm("d/k=short-caller", 1)
	results := make([]engine.Result, len(items))
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := s.Apply(ctx, items, results)
		cancel()
		if err != nil {
			t.Fatalf("request %d of a 50 ms caller, store timeout 1 s: %v", i, err)
		}
	}
	if st := s.Stats(); st.Expired != 0 {
		t.Errorf("Stats() = %+v, want none expired", st)
	}
}

// TestNoResendAfterWait: a request that found Redis without the function
// library is sent again once the library is loaded, unless its caller was
// answered meanwhile. With 60 ms each way and a 100 ms store timeout, the
// caller's wait (150 ms) ends before the library is loaded (two round
// trips, 240 ms): the request must not run then, with nobody to hear of it.
func TestNoResendAfterWait(t *testing.T) {
	srv := redistest.Start(t)
	proxy, s := behindProxy(t, srv, Options{Timeout: 100 * time.Millisecond, minPipelineBound: starvedBound})
	items := everyAlgorithm("d/k=resend", 1)
	lookFull(t, s, items, "before the flush")
	if _, err := redistest.Command(srv.Addr(), "FUNCTION", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	st0 := s.Stats()
	proxy.SetLatency(60 * time.Millisecond)
	results := make([]engine.Result, len(items))
	if _, err := s.Apply(context.Background(), items, results); err == nil {
		t.Fatal("answered within a wait shorter than the library's load")
	}
	proxy.Heal()
	settle(t, s)
	if st := s.Stats(); st.Indeterminate != st0.Indeterminate {
		t.Errorf("Stats() = %+v (before: %+v), want no indeterminate outcome", st, st0)
	}
	lookFull(t, s, items, "after the library was loaded")
}

// TestSlowNetworkConsumesNothing: with 15 ms added each way and a 10 ms
// store timeout, every request reaches Redis past its deadline: each fails,
// Redis decides none, and once the network heals every counter still has
// its whole limit (the 120 sequential requests).
func TestSlowNetworkConsumesNothing(t *testing.T) {
	srv := redistest.Start(t)
	proxy, s := behindProxy(t, srv, Options{Timeout: 10 * time.Millisecond, minPipelineBound: starvedBound})
	items := everyAlgorithm("d/k=slow", 1)
	lookFull(t, s, items, "before the fault") // and the connections are up

	// Outcomes of the 120 requests only (a look that missed its deadline
	// has its own).
	st0 := s.Stats()
	proxy.SetLatency(15 * time.Millisecond)
	results := make([]engine.Result, len(items))
	for i := range 120 {
		if ok, err := s.Apply(context.Background(), items, results); err == nil {
			t.Fatalf("request %d through 30 ms of round trip with a 10 ms timeout = %v, want an error", i, ok)
		}
	}
	proxy.Heal()
	settle(t, s)
	st := s.Stats()
	if expired, indeterminate := st.Expired-st0.Expired, st.Indeterminate-st0.Indeterminate; expired != 120 || indeterminate != 0 {
		t.Errorf("Stats() = %+v (before the requests: %+v): %d expired, %d indeterminate; want 120 expired (Redis said so), 0 indeterminate", st, st0, expired, indeterminate)
	}
	lookFull(t, s, items, "after 120 requests past their deadline")
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

// TestCutRepliesRunOnce: the connection is reset after every other reply
// left Redis (the request ran, its caller never hears of it). No request
// runs twice: 300 requests of 1 hit consume at most 300, on one node and
// on a cluster (whose client library would otherwise send the pipeline
// again), and each cut is counted as indeterminate.
func TestCutRepliesRunOnce(t *testing.T) {
	check := func(t *testing.T, s *Store, cuts func() int, heal func()) {
		items := []engine.Item{{Desc: "d/k=cut", Rule: storetest.Rule(engine.FixedWindow, 1000, time.Hour, 0), Hits: 1}}
		results := make([]engine.Result, 1)
		failed := 0
		for range 300 {
			if _, err := s.Apply(context.Background(), items, results); err != nil {
				failed++
			}
		}
		heal()
		settle(t, s)
		st := s.Stats()
		// The look is asked again if it misses the 100 ms timeout on a busy
		// machine (a look consumes nothing).
		items[0].Hits = 0
		for deadline := time.Now().Add(10 * time.Second); ; {
			_, err := s.Apply(context.Background(), items, results)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a look after the cuts, asked for 10 s: %v", err)
			}
		}
		consumed := 1000 - results[0].Remaining
		t.Logf("300 requests: %d failed, %d consumed, %d cuts, %+v", failed, consumed, cuts(), st)
		if consumed > 300 {
			t.Errorf("300 requests of one hit consumed %d: some ran twice", consumed)
		}
		if failed == 0 || consumed < uint64(300-failed) {
			t.Errorf("%d failed, %d consumed: the cuts did not happen, or answered requests were not counted", failed, consumed)
		}
		// A request fails by a cut (indeterminate: it ran, its reply was
		// lost) or, on a busy machine, by the 100 ms timeout (expired or
		// given back when Redis's reply says so): every cut is
		// indeterminate, and every failed request has an outcome.
		if n := cuts(); st.Indeterminate < uint64(n) {
			t.Errorf("indeterminate %d, want every cut (%d) counted", st.Indeterminate, n)
		}
		if outcomes := st.Indeterminate + st.Expired + st.GivenBack; outcomes < uint64(failed) {
			t.Errorf("indeterminate %d, expired %d, given back %d, want every failed request (%d) counted", st.Indeterminate, st.Expired, st.GivenBack, failed)
		}
	}
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		proxy, s := behindProxy(t, srv, Options{Timeout: 100 * time.Millisecond})
		lookFull(t, s, everyAlgorithm("d/k=warm", 0), "warming up")
		proxy.CutEveryReply(2, "FCALL")
		check(t, s, proxy.Cuts, proxy.Heal)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartProxiedCluster(t, 3)
		s := newStore(t, Options{ClusterSeeds: c.Seeds(), Timeout: 100 * time.Millisecond})
		lookFull(t, s, everyAlgorithm("d/k=warm", 0), "warming up")
		for _, p := range c.Proxies {
			p.CutEveryReply(2, "FCALL")
		}
		check(t, s, func() int {
			n := 0
			for _, p := range c.Proxies {
				n += p.Cuts()
			}
			return n
		}, func() {
			for _, p := range c.Proxies {
				p.Heal()
			}
		})
	})
}

// TestExpiredRequestSentAgain: a request that reaches Redis after its
// deadline decided nothing, so it is sent again while its caller waits:
// the caller gets a decision, not an error (the audit's saturation errors:
// a loaded host made Redis wait for a core longer than the store timeout).
// Redis is paused from before the request leaves until 240 ms after, with
// a 200 ms store timeout: the request reaches it past its deadline, and the
// refusal is back before the caller's wait (300 ms) ends. Margins of 40 ms
// and 60 ms; the caller waits 5 s.
func TestExpiredRequestSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL(), Timeout: 200 * time.Millisecond, minPipelineBound: starvedBound})
	items := everyAlgorithm("d/k=resent", 1)
	lookFull(t, s, items, "before the pause")
	st0 := s.Stats()
	srv.Pause()
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		time.Sleep(240 * time.Millisecond)
		srv.Resume()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	results := make([]engine.Result, len(items))
	ok, err := s.Apply(ctx, items, results)
	<-resumed
	if err != nil || !ok {
		t.Fatalf("Apply through a Redis paused past the deadline = %v, %v; want admitted (sent again)", ok, err)
	}
	st := s.Stats()
	if resent, expired := st.Resent-st0.Resent, st.Expired-st0.Expired; resent == 0 || expired != 0 || st.Indeterminate != st0.Indeterminate {
		t.Errorf("Stats() = %+v (before: %+v): want a resend, no expired or indeterminate outcome", st, st0)
	}
	for i, r := range results {
		if want := uint64(items[i].Rule.Limit) - 1; r.Remaining != want {
			t.Errorf("%s: remaining %d after one admitted hit, want %d (counted once)", items[i].Rule.Algorithm(), r.Remaining, want)
		}
	}
}

// TestPausedRedisNotIndeterminate: requests sent to a Redis paused
// (SIGSTOP) for longer than the pipeline's bound are answered with an
// error at their deadline; when Redis resumes it runs them past their
// deadlines, deciding nothing, and says so: they are counted expired, not
// indeterminate, and nothing is consumed.
func TestPausedRedisNotIndeterminate(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL(), Timeout: 20 * time.Millisecond})
	bound := pipelineBound(s.opts)
	items := everyAlgorithm("d/k=paused", 1)
	res := make([]engine.Result, len(items))
	ctx := context.Background()
	if ok, err := s.Apply(ctx, everyAlgorithm("d/k=warm", 1), res); err != nil || !ok {
		t.Fatalf("before the pause: %v %v", ok, err)
	}
	before := s.Stats()
	srv.Pause()
	for i := range 4 {
		callCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		if _, err := s.Apply(callCtx, items, res); err == nil {
			t.Fatalf("request %d to a paused Redis: no error", i)
		}
		cancel()
	}
	time.Sleep(3 * bound) // the fault lasts past the pipelines' bound
	srv.Resume()
	// Every request sent (a pipeline counts its scripts once it is read)
	// has an outcome.
	var st Stats
	var sent uint64
	for deadline := time.Now().Add(10 * time.Second); ; {
		st = s.Stats()
		sent = st.Scripts - before.Scripts
		if sent > 0 && st.Expired-before.Expired+st.Indeterminate-before.Indeterminate == sent || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d requests sent during the pause: %d expired, %d indeterminate", sent, st.Expired-before.Expired, st.Indeterminate-before.Indeterminate)
	if sent == 0 || st.Indeterminate != before.Indeterminate || st.Expired-before.Expired != sent {
		t.Errorf("%d requests sent to the paused Redis: %d expired, %d indeterminate; want all expired, none indeterminate",
			sent, st.Expired-before.Expired, st.Indeterminate-before.Indeterminate)
	}
	settle(t, s)
	lookFull(t, s, items, "after the pause")
}
