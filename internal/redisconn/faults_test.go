package redisconn

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/redistest"
)

// The driver under faults: a fault-injecting proxy (redistest.FaultProxy)
// between the Conn and redis-server, or a paused Redis. The stub function
// counts in Redis what ran, so each test checks what a fault costs: a
// request runs once at most, and every request the caller did not hear of
// is told (OnLate, OnIndeterminate) or refused by Redis as late.

// starvedBound is the pipeline bound of the tests that count each
// request's outcome: on a machine starved by the race detector and other
// tests, a reply can come after the default 100 ms, and the Conn then
// rightly counts it as indeterminate.
const starvedBound = time.Second

// behindProxy returns a fault proxy in front of srv and a Conn through it
// with opts (its URL set).
func behindProxy(t *testing.T, srv *redistest.Server, opts Options) (*redistest.FaultProxy, *testConn) {
	t.Helper()
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	opts.URL = "redis://" + proxy.Addr() + "/0"
	return proxy, newConn(t, opts)
}

// TestShortCallerLongTimeout: a caller that waits less than the timeout
// and its grace gets a deadline in Redis within its own wait, and its
// requests run: with a timeout of a second and callers of 50 ms, every
// request was refused as past its deadline when the deadline was the
// caller's less the whole timeout's grace (500 ms).
func TestShortCallerLongTimeout(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, Options{URL: srv.URL(), Timeout: time.Second})
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := c.run(ctx, "short-caller", 1)
		cancel()
		if err != nil {
			t.Fatalf("request %d of a 50 ms caller, timeout 1 s: %v", i, err)
		}
	}
}

// TestNoResendAfterWait: a request that found Redis without the function
// library is sent again once the library is loaded, unless its caller was
// answered meanwhile. With 60 ms each way and a 100 ms timeout, the
// caller's wait (150 ms) ends before the library is loaded (two round
// trips, 240 ms): the request must not run then, with nobody to hear of it.
func TestNoResendAfterWait(t *testing.T) {
	srv := redistest.Start(t)
	proxy, c := behindProxy(t, srv, Options{Timeout: 100 * time.Millisecond, MinPipelineBound: starvedBound})
	if _, err := redistest.Command(srv.Addr(), "FUNCTION", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(60 * time.Millisecond)
	if _, err := c.bounded("resend", 1); err == nil {
		t.Fatal("answered within a wait shorter than the library's load")
	}
	proxy.Heal()
	c.settle()
	if n := c.out.indeterminate.Load(); n != 0 {
		t.Errorf("%d indeterminate, want none", n)
	}
	if n := c.count(t, "resend"); n != 0 {
		t.Errorf("the request ran %d times after its caller was answered, want never", n)
	}
}

// TestSlowNetworkRunsNothing: with 15 ms added each way and a 10 ms
// timeout, every request reaches Redis past its deadline: each fails (or
// is answered as refused), Redis runs none and says so, and none is
// indeterminate (the 120 sequential requests).
func TestSlowNetworkRunsNothing(t *testing.T) {
	srv := redistest.Start(t)
	proxy, c := behindProxy(t, srv, Options{Timeout: 10 * time.Millisecond, MinPipelineBound: starvedBound})
	if _, err := c.bounded("warm", 0); err != nil { // the connections up
		t.Fatal(err)
	}
	proxy.SetLatency(15 * time.Millisecond)
	refused := 0
	for i := range 120 {
		n, err := c.bounded("slow", 1)
		switch {
		case errors.Is(err, errExpiredReply):
			refused++
		case err == nil:
			t.Fatalf("request %d through 30 ms of round trip with a 10 ms timeout = %d, want an error", i, n)
		}
	}
	proxy.Heal()
	c.settle()
	told, indeterminate := int64(refused)+c.out.lateExpired.Load(), c.out.indeterminate.Load()
	if told != 120 || indeterminate != 0 || c.out.late.Load() != 0 {
		t.Errorf("%d refused as late (%d answered, %d late), %d ran late, %d indeterminate; want 120 refused, none ran, none indeterminate",
			told, refused, c.out.lateExpired.Load(), c.out.late.Load(), indeterminate)
	}
	if n := c.count(t, "slow"); n != 0 {
		t.Errorf("Redis counted %d requests that reached it past their deadlines, want 0", n)
	}
}

// TestLateReplyTold: replies that come after their callers stopped
// waiting are told to OnLate, with the request and its call's keys, and
// run within their undo span. With a 240 ms timeout, requests reach Redis
// 150 ms after they leave, in the last half of their deadline (so their
// runs carry an undo log), and replies take 240 ms back, past the callers'
// wait (deadline plus half a timeout: 360 ms). Each margin is 30 ms. While
// the fault lasts, the bound of Redis's clock lead (read from replies that
// take 240 ms back) drops by as much, so some requests are sent with an
// earlier deadline and expire instead: never later, never run.
func TestLateReplyTold(t *testing.T) {
	srv := redistest.Start(t)
	proxy, c := behindProxy(t, srv, Options{Timeout: lateTimeout, MinPipelineBound: starvedBound})
	if _, err := c.bounded("late", 0); err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(150 * time.Millisecond)
	proxy.SetReplyDelay(90 * time.Millisecond)
	const n = 12
	for i := range n {
		if _, err := c.bounded("late", 1); err == nil {
			t.Fatalf("request %d: answered within the wait over 390 ms of round trip", i)
		}
	}
	proxy.Heal()
	c.settle()
	late, undo, expired := c.out.late.Load(), c.out.lateUndo.Load(), c.out.lateExpired.Load()
	if late+expired != n || late == 0 || undo != late || c.out.indeterminate.Load() != 0 {
		t.Errorf("%d late (%d with an undo log), %d refused as late, %d indeterminate; want %d told, some late, all with undo logs, none indeterminate",
			late, undo, expired, c.out.indeterminate.Load(), n)
	}
	if got := c.count(t, "late"); got != late {
		t.Errorf("Redis counted %d, want the %d late replies' runs", got, late)
	}
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	for _, l := range c.out.lates {
		if r, ok := l.Request.(*stubRequest); !ok || r.key != "late" || len(l.Keys) != 1 || l.Keys[0] != "late" || l.Node != "" {
			t.Errorf("a late reply told as %+v, want the request on late, its keys [late], node \"\"", l)
		}
	}
}

// lateTimeout is the timeout of TestLateReplyTold's timings.
const lateTimeout = 240 * time.Millisecond

// TestCloseReadsLateReplies: a Conn closed while a late reply is on its
// way (rls shutting down during a slow Redis) reads it and tells it before
// Close returns; its connections are still open while OnLate runs, for the
// caller to give the request back.
func TestCloseReadsLateReplies(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartFaultProxy(t, srv.Addr())
	var c *Conn
	var gaveBack error
	told := make(chan struct{}, 1)
	c, err := New(Options{URL: "redis://" + proxy.Addr() + "/0", Timeout: lateTimeout, MinPipelineBound: starvedBound,
		Library: stubLibrary, Function: stubRun,
		OnLate: func(l Late) {
			if f, err := stubFields(l.Reply); err == nil && f[0] == stubRan {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				gaveBack = c.Call(ctx, stubGiveBack, l.Keys, 1)
				cancel()
			}
			told <- struct{}{}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	tc := &testConn{c, &outcomes{}}
	if err := c.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(150 * time.Millisecond)
	proxy.SetReplyDelay(90 * time.Millisecond)
	if _, err := tc.bounded("close", 1); err == nil {
		t.Fatal("answered within the wait over 390 ms of round trip")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-told:
	default:
		t.Fatal("Close returned before the late reply was told")
	}
	if gaveBack != nil {
		t.Errorf("giving the late run back from OnLate during Close: %v", gaveBack)
	}
	proxy.Heal()
	other := newConn(t, Options{URL: srv.URL()})
	if n := other.count(t, "close"); n != 0 {
		t.Errorf("after Close the key holds %d, want 0 (ran and given back, or refused)", n)
	}
}

// TestCutRepliesRunOnce: the connection is reset after every other reply
// left Redis (the request ran, its caller never hears of it). No request
// runs twice: 300 requests of 1 hit count at most 300, on one node and on
// a cluster (whose client library would otherwise send the pipeline
// again), and each cut is counted as indeterminate.
func TestCutRepliesRunOnce(t *testing.T) {
	check := func(t *testing.T, c *testConn, cuts func() int, heal func()) {
		failed := 0
		for range 300 {
			if _, err := c.bounded("{cut}", 1); err != nil {
				failed++
			}
		}
		heal()
		c.settle()
		ran := c.count(t, "{cut}")
		indeterminate, told := c.out.indeterminate.Load(), c.out.late.Load()+c.out.lateExpired.Load()
		t.Logf("300 requests: %d failed, %d ran, %d cuts, %d indeterminate, %d late", failed, ran, cuts(), indeterminate, told)
		if ran > 300 {
			t.Errorf("300 requests of one hit counted %d: some ran twice", ran)
		}
		if failed == 0 || ran < int64(300-failed) {
			t.Errorf("%d failed, %d ran: the cuts did not happen, or answered requests did not run", failed, ran)
		}
		// A request fails by a cut (indeterminate: it ran, its reply was
		// lost) or, on a busy machine, by the 100 ms timeout (refused or
		// late, as Redis's reply says): every cut is indeterminate, and
		// every failed request has an outcome.
		if n := cuts(); indeterminate < int64(n) {
			t.Errorf("indeterminate %d, want every cut (%d) counted", indeterminate, n)
		}
		if indeterminate+told < int64(failed) {
			t.Errorf("indeterminate %d, late %d, want every failed request (%d) told", indeterminate, told, failed)
		}
	}
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		proxy, c := behindProxy(t, srv, Options{Timeout: 100 * time.Millisecond})
		if _, err := c.bounded("warm", 0); err != nil {
			t.Fatal(err)
		}
		proxy.CutEveryReply(2, "FCALL")
		check(t, c, proxy.Cuts, proxy.Heal)
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartProxiedCluster(t, 3)
		c := newConn(t, Options{ClusterSeeds: cl.Seeds(), Timeout: 100 * time.Millisecond})
		if _, err := c.bounded("{cut}", 0); err != nil {
			t.Fatal(err)
		}
		for _, p := range cl.Proxies {
			p.CutEveryReply(2, "FCALL")
		}
		check(t, c, func() int {
			n := 0
			for _, p := range cl.Proxies {
				n += p.Cuts()
			}
			return n
		}, func() {
			for _, p := range cl.Proxies {
				p.Heal()
			}
		})
	})
}

// TestExpiredRequestSentAgain: a request that reaches Redis after its
// deadline did nothing, so it is sent again while its caller waits: the
// caller gets its reply, not an error (the audit's saturation errors: a
// loaded host made Redis wait for a core longer than the timeout). Redis
// is paused from before the request leaves until 500 ms after, with a 400
// ms timeout: the request reaches it past its deadline, and the refusal is
// back before the caller's wait (600 ms) ends. Margins of 100 ms each (40
// and 60 ms at half these timings failed once in a loaded run under the
// race detector); the caller waits 5 s.
func TestExpiredRequestSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, Options{URL: srv.URL(), Timeout: 400 * time.Millisecond, MinPipelineBound: starvedBound})
	if _, err := c.bounded("resent", 0); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		time.Sleep(500 * time.Millisecond)
		srv.Resume()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := c.run(ctx, "resent", 1)
	<-resumed
	if err != nil || n != 1 {
		t.Fatalf("a call through a Redis paused past the deadline = %d, %v; want run once (sent again)", n, err)
	}
	if st := c.Stats(); st.Resent == 0 || c.out.indeterminate.Load() != 0 || c.out.lateExpired.Load() != 0 {
		t.Errorf("Stats() = %+v, %d indeterminate, %d refused late: want a resend, nothing else", st, c.out.indeterminate.Load(), c.out.lateExpired.Load())
	}
}

// TestPausedRedisNotIndeterminate: requests sent to a Redis paused
// (SIGSTOP) for longer than the pipeline's bound are answered with an
// error at their deadline; when Redis resumes it runs them past their
// deadlines, doing nothing, and says so: they are told as refused, not
// indeterminate, and nothing ran.
func TestPausedRedisNotIndeterminate(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, Options{URL: srv.URL(), Timeout: 20 * time.Millisecond})
	bound := pipelineBound(c.opts)
	if _, err := c.bounded("warm", 1); err != nil {
		t.Fatalf("before the pause: %v", err)
	}
	before := c.Stats()
	srv.Pause()
	for i := range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if _, err := c.run(ctx, "paused", 1); err == nil {
			t.Fatalf("request %d to a paused Redis: no error", i)
		}
		cancel()
	}
	time.Sleep(3 * bound) // the fault lasts past the pipelines' bound
	srv.Resume()
	// Every request sent (a pipeline counts its scripts once it is read)
	// has an outcome.
	var sent, refused int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		sent = int64(c.Stats().Scripts - before.Scripts)
		refused = c.out.lateExpired.Load()
		if sent > 0 && refused+c.out.indeterminate.Load() == sent || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d requests sent during the pause: %d refused as late, %d indeterminate", sent, refused, c.out.indeterminate.Load())
	if sent == 0 || c.out.indeterminate.Load() != 0 || refused != sent {
		t.Errorf("%d requests sent to the paused Redis: %d refused as late, %d indeterminate; want all refused, none indeterminate",
			sent, refused, c.out.indeterminate.Load())
	}
	c.settle()
	if n := c.count(t, "paused"); n != 0 {
		t.Errorf("Redis counted %d requests sent during the pause, want 0", n)
	}
}

// TestPerScriptBatching: the calls of one batch to one node share FCALLs,
// up to PerScript each, and each gets its own reply, in order.
func TestPerScriptBatching(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, Options{URL: srv.URL(), PerScript: 32})
	var calls []*call
	for i := range 60 {
		r := &stubRequest{key: "batch", hits: int64(i + 1)}
		cl := &call{ctx: context.Background(), keys: []string{r.key}, req: r, done: make(chan struct{})}
		cl.state.Store(pending | 1<<statusBits)
		calls = append(calls, cl)
	}
	before := c.Stats()
	c.b.send(0, calls)
	if got := c.Stats().Scripts - before.Scripts; got != 2 {
		t.Errorf("60 requests went in %d FCALLs, want 2 (32 per FCALL)", got)
	}
	total := int64(0)
	for i, cl := range calls {
		<-cl.done
		total += int64(i + 1)
		f, err := stubFields(cl.reply)
		if cl.err != nil || err != nil || f[0] != stubRan || f[2] != total {
			t.Fatalf("request %d: %v %v %v; want run, the key at %d", i, cl.reply, cl.err, err, total)
		}
	}
}

// TestGathering: on a single node, the calls that come while a pipeline is
// in flight wait for it and go together in the next round trip; a
// pipeline out for longer than the gather span holds nobody.
func TestGathering(t *testing.T) {
	srv := redistest.Start(t)
	t.Run("the calls of a round trip go in one", func(t *testing.T) {
		// 100 ms each way and a timeout of 5 s (a gather span of 1.25 s):
		// the 20 calls made while the first flies wait for its return.
		proxy, c := behindProxy(t, srv, Options{Timeout: 5 * time.Second})
		proxy.SetLatency(100 * time.Millisecond)
		before := c.Stats()
		sent, first := c.send("gathered")
		<-sent
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for range 20 {
			wg.Go(func() {
				if _, err := c.bounded("gathered", 1); err != nil {
					errs <- err
				}
			})
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got := c.count(t, "gathered"); got != 21 {
			t.Errorf("the key at %d, want 21 (every call ran once)", got)
		}
		// Two round trips: the first call's, then the 20 gathered while
		// it flew (a machine that started some only after it came back
		// has them in a third).
		if got := c.Stats().RoundTrips - before.RoundTrips; got < 2 || got > 3 {
			t.Errorf("21 calls went in %d round trips, want 2 (3 at most)", got)
		}
	})
	t.Run("a slow pipeline holds nobody past the span", func(t *testing.T) {
		// A timeout of 40 ms: a span of 10 ms. Redis 500 ms away: the first
		// pipeline is out for a second at least; the second call leaves
		// meanwhile.
		proxy, c := behindProxy(t, srv, Options{Timeout: 40 * time.Millisecond, MinPipelineBound: starvedBound})
		proxy.SetLatency(500 * time.Millisecond)
		sent, _ := c.send("slow")
		<-sent
		start := time.Now()
		second, _ := c.send("slow")
		select {
		case at := <-second:
			if d := at.Sub(start); d > 400*time.Millisecond {
				t.Errorf("the second call left %v after it came, want it gone before the first pipeline's reply (a second)", d)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the second call not sent within 5 s")
		}
	})
}

// send asks c to add a hit to key, bounded as bounded, and returns when the
// call is sent (its first send) and its error.
func (c *testConn) send(key string) (sent <-chan time.Time, done <-chan error) {
	at, errs := make(chan time.Time, 1), make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.MaxWait())
		defer cancel()
		var once sync.Once
		_, err := c.Do(ctx, "", []string{key}, true, &stubRequest{key: key, hits: 1}, func(t time.Time, _ int) {
			once.Do(func() { at <- t })
		})
		errs <- err
	}()
	return at, errs
}
