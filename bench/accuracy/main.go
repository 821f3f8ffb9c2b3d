// Command accuracy measures how far the approximate algorithms stray from
// the exact one: it replays a seeded synthetic trace of clients (steady,
// Poisson and bursty, around and above their limits) through
// sliding_window and fixed_window and compares every decision with an
// exact sliding window's, with the engine's own algorithms (engine.Evaluate
// on in-memory states; no store, no server). It prints Markdown tables for
// the README; `make bench-accuracy` runs it.
//
//	go run ./bench/accuracy [-requests 10000000] [-seed 1]
//
// Each client has a limit of L hits per window W. A request at t is
// exactly admissible when fewer than L hits are counted in (t−W, t], the
// window the sliding log counts. Two ways of counting are measured:
//
// Every request counts (Cloudflare's setting, where a counter counts
// every request of a source; rls with count_denied_hits). The history is
// then the trace itself, whatever the decisions, so each decision can be
// compared with the exact one on the same history:
//
//   - wrongly allowed (denied): the share of all requests that the
//     algorithm admits (denies) and the exact count denies (admits);
//   - mean rate error: the mean, over requests whose exact count n is not
//     0, of |c − n| / n, where c is the count the algorithm compares with
//     the limit before the request (sliding_window: the previous window's
//     count × the part of it still in the sliding window + the current
//     window's count; fixed_window: the current window's count).
//     Cloudflare's "average difference between real rate and approximate
//     rate".
//
// Only admitted hits count (rls's default: a denied request consumes
// nothing). Each algorithm then makes its own history, and is compared
// with the engine's sliding_log (exact) on the same trace:
//
//   - admitted: the hits the algorithm admitted, as a share of what the
//     sliding log admitted;
//   - differs: the share of requests decided otherwise than by the sliding
//     log (a request denied a little earlier or later counts, so this is
//     large wherever clients run at their limit);
//   - worst window: the most hits admitted in any (t−W, t], over L (1.00×
//     is exact, 2.00× twice the limit), on the trace and on a boundary
//     scenario that seeks the worst case: a client silent for a window,
//     L hits at the last microsecond of the next, then one request every
//     W/(100·L).
package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

func main() {
	opts := defaultOptions()
	flag.Int64Var(&opts.Requests, "requests", opts.Requests, "requests in the trace (at least: whole clients are added until it is reached)")
	flag.Uint64Var(&opts.Seed, "seed", opts.Seed, "the trace's seed: the same seed gives the same trace and figures")
	flag.IntVar(&opts.Workers, "workers", opts.Workers, "clients replayed at once")
	flag.Float64Var(&opts.MinLoad, "min-load", opts.MinLoad, "the least rate of a client, as a multiple of its limit")
	flag.Float64Var(&opts.MaxLoad, "max-load", opts.MaxLoad, "the greatest rate of a client, as a multiple of its limit")
	flag.Parse()
	start := time.Now()
	rep := run(opts)
	rep.write(os.Stdout)
	fmt.Fprintf(os.Stderr, "accuracy: %d requests in %s\n", rep.requests, time.Since(start).Round(time.Millisecond))
}

// options are what a run depends on.
type options struct {
	Requests         int64
	Seed             uint64
	Workers          int
	MinLoad, MaxLoad float64 // a client's rate is load × L/W, load log-uniform in [MinLoad, MaxLoad]
}

func defaultOptions() options {
	return options{Requests: 10_000_000, Seed: 1, Workers: runtime.GOMAXPROCS(0), MinLoad: 0.5, MaxLoad: 4}
}

// The trace's client population. Windows and limits are drawn per client;
// each client sends for windowsPerClient windows at a rate of load × L/W
// (options: by default around and above the limit).
var (
	windows          = []time.Duration{time.Second, 10 * time.Second, time.Minute, 5 * time.Minute}
	limits           = []uint32{10, 20, 50, 100, 200}
	windowsPerClient = 30
)

// pattern is how a client spaces its requests.
type pattern uint8

const (
	steady  pattern = iota // one every 1/rate, from a random phase
	poisson                // exponential gaps
	bursty                 // on/off: Poisson at k × rate while on (k from 5 to 10), silent the rest
	numPatterns
)

var patternNames = [numPatterns]string{"steady", "Poisson", "bursty"}

// client is one source of the trace: its limit and its requests (µs after
// t0, ascending).
type client struct {
	pattern pattern
	window  time.Duration
	limit   uint32
	times   []int64
}

// t0 is the trace's start: aligned to every window (fixed windows are
// aligned to the epoch).
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()

// newClient draws client i of the trace of opts.
func newClient(opts options, i int) *client {
	rng := rand.New(rand.NewPCG(opts.Seed, uint64(i)))
	c := &client{
		pattern: pattern(i % int(numPatterns)),
		window:  windows[rng.IntN(len(windows))],
		limit:   limits[rng.IntN(len(limits))],
	}
	load := opts.MinLoad * math.Exp(rng.Float64()*math.Log(opts.MaxLoad/opts.MinLoad))
	w := float64(c.window.Microseconds())
	span := w * float64(windowsPerClient)
	gap := w / (load * float64(c.limit)) // mean µs between requests
	t := rng.Float64() * w               // a random phase
	switch c.pattern {
	case steady:
		for ; t < span; t += gap {
			c.times = append(c.times, int64(t))
		}
	case poisson:
		for t += rng.ExpFloat64() * gap; t < span; t += rng.ExpFloat64() * gap {
			c.times = append(c.times, int64(t))
		}
	case bursty:
		k := 5 + rng.Float64()*5
		on := w / 2 // mean length of a burst
		for t < span {
			end := t + rng.ExpFloat64()*on
			for t += rng.ExpFloat64() * gap / k; t < end && t < span; t += rng.ExpFloat64() * gap / k {
				c.times = append(c.times, int64(t))
			}
			t = end + rng.ExpFloat64()*on*(k-1)
		}
	}
	return c
}

// tally is what one algorithm did on part of the trace. Counts are
// integers and float sums are added per client in client order, so that a
// run's figures do not depend on how clients were spread over workers.
type tally struct {
	requests int64
	// Every request counts.
	wronglyAllowed, wronglyDenied int64
	relErrSum                     float64
	relErrN                       int64
	perPattern                    [numPatterns][3]int64 // requests, wrongly allowed, wrongly denied
	// Only admitted hits count.
	admitted, exactAdmitted int64
	differs                 int64
	worst                   float64 // most admitted in a window / limit
	// The boundary scenario's worst window.
	boundary boundaryResult
}

func (t *tally) add(o *tally) {
	t.requests += o.requests
	t.wronglyAllowed += o.wronglyAllowed
	t.wronglyDenied += o.wronglyDenied
	t.relErrSum += o.relErrSum
	t.relErrN += o.relErrN
	for p := range t.perPattern {
		for k := range t.perPattern[p] {
			t.perPattern[p][k] += o.perPattern[p][k]
		}
	}
	t.admitted += o.admitted
	t.exactAdmitted += o.exactAdmitted
	t.differs += o.differs
	t.worst = max(t.worst, o.worst)
}

// measured are the approximate algorithms.
var measured = []string{engine.SlidingWindow, engine.FixedWindow}

// report is a run's result.
type report struct {
	opts     options
	clients  int
	requests int64
	patterns [numPatterns]int64 // requests per pattern
	tallies  []tally            // per measured algorithm
	logWorst float64            // the sliding log's worst window: 1 at most
}

// run replays the trace of opts.
func run(opts options) *report {
	rep := &report{opts: opts, tallies: make([]tally, len(measured))}
	type job struct {
		i int
		c *client
	}
	type result struct {
		i       int
		c       *client
		tallies []tally
		log     float64
	}
	jobs := make(chan job)
	results := make(chan result, 64)
	var wg sync.WaitGroup
	for range max(opts.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				ts, log := replay(j.c)
				results <- result{i: j.i, c: j.c, tallies: ts, log: log}
			}
		}()
	}
	// The collector adds the results up in client order, whatever order
	// they come back in.
	done := make(chan struct{})
	go func() {
		defer close(done)
		pending := map[int]result{}
		for next := 0; ; {
			r, ok := pending[next]
			if !ok {
				if r, ok = <-results; !ok {
					return
				}
				pending[r.i] = r
				continue
			}
			delete(pending, next)
			next++
			rep.clients++
			rep.requests += int64(len(r.c.times))
			rep.patterns[r.c.pattern] += int64(len(r.c.times))
			rep.logWorst = max(rep.logWorst, r.log)
			for a := range rep.tallies {
				rep.tallies[a].add(&r.tallies[a])
			}
		}
	}()
	// Clients are drawn until the trace holds opts.Requests.
	var handed int64
	for i := 0; handed < opts.Requests; i++ {
		c := newClient(opts, i)
		handed += int64(len(c.times))
		jobs <- job{i, c}
	}
	close(jobs)
	wg.Wait()
	close(results)
	<-done
	for a, alg := range measured {
		rep.tallies[a].boundary = boundary(alg)
	}
	return rep
}

// limiter is one counter of one algorithm, decided by engine.Evaluate.
type limiter struct {
	limit   *engine.Rule
	st      engine.State
	items   []engine.Item
	states  []*engine.State
	results []engine.Result
}

func newLimiter(alg string, limit uint32, w time.Duration) *limiter {
	l := &limiter{
		limit:   engine.MustCompile(engine.Spec{Algorithm: alg, Limit: limit, Unit: engine.Second, Multiplier: uint32(w / time.Second)}),
		results: make([]engine.Result, 1),
	}
	l.items = []engine.Item{{Desc: "client", Rule: l.limit}}
	l.states = []*engine.State{&l.st}
	return l
}

// take asks for hits at t (µs) and reports whether they were admitted.
func (l *limiter) take(t int64, hits uint64) bool {
	l.items[0].Hits = hits
	return engine.Evaluate(time.UnixMicro(t), l.items, l.states, l.results)
}

// count is what the limiter compares with its limit at t, the instant of
// its last decision (its state is normalized to it).
func (l *limiter) count(t int64) float64 { return engine.WindowCount(l.limit, &l.st, t) }

// replay runs client c through the sliding log and each measured
// algorithm, and returns their tallies and the sliding log's worst window.
func replay(c *client) ([]tally, float64) {
	w := c.window.Microseconds()
	// The exact limiter, counting admitted hits.
	exact := make([]bool, len(c.times))
	logLimiter := newLimiter(engine.SlidingLog, c.limit, c.window)
	logWorst := worstWindow{w: w, limit: c.limit}
	for i, rel := range c.times {
		if exact[i] = logLimiter.take(t0+rel, 1); exact[i] {
			logWorst.admit(t0+rel, 1)
		}
	}
	out := make([]tally, len(measured))
	for a, alg := range measured {
		out[a] = replayAlgorithm(c, alg, exact)
	}
	return out, logWorst.worst
}

// replayAlgorithm runs client c through alg, both ways of counting; exact
// are the sliding log's decisions.
func replayAlgorithm(c *client, alg string, exact []bool) tally {
	var t tally
	w := c.window.Microseconds()
	limit := float64(c.limit)
	// Every request counts: a counter with no effective limit takes every
	// request; the decision is its count against the limit.
	all := newLimiter(alg, math.MaxUint32, c.window)
	seen := newRing(3 * int(c.limit)) // every request in (t−W, t]
	// Only admitted hits count.
	own := newLimiter(alg, c.limit, c.window)
	admittedWorst := worstWindow{w: w, limit: c.limit}
	for i, rel := range c.times {
		at := t0 + rel
		t.requests++

		seen.dropUpTo(at - w)
		n := seen.len()
		all.take(at, 1)
		approx := all.count(at) - 1 // before this request
		seen.push(at)
		admits, exactAdmits := approx+1 <= limit, n+1 <= int(c.limit)
		pp := &t.perPattern[c.pattern]
		pp[0]++
		switch {
		case admits && !exactAdmits:
			t.wronglyAllowed++
			pp[1]++
		case !admits && exactAdmits:
			t.wronglyDenied++
			pp[2]++
		}
		if n > 0 {
			t.relErrSum += math.Abs(approx-float64(n)) / float64(n)
			t.relErrN++
		}

		admitted := own.take(at, 1)
		if admitted {
			t.admitted++
			admittedWorst.admit(at, 1)
		}
		if exact[i] {
			t.exactAdmitted++
		}
		if admitted != exact[i] {
			t.differs++
		}
	}
	t.worst = admittedWorst.worst
	return t
}

// worstWindow tracks the most hits admitted in any (t−W, t].
type worstWindow struct {
	w      int64
	limit  uint32
	hits   ring
	worst  float64
	most   int
	span   int64 // from the first to the last hit of the worst window
	ending int64
}

func (ww *worstWindow) admit(t int64, hits int) {
	ww.hits.dropUpTo(t - ww.w)
	for range hits {
		ww.hits.push(t)
	}
	if n := ww.hits.len(); n > ww.most {
		ww.most, ww.span, ww.ending = n, t-ww.hits.first(), t
		ww.worst = float64(n) / float64(ww.limit)
	}
}

// boundaryResult is the boundary scenario's worst window.
type boundaryResult struct {
	ratio  float64
	most   int
	span   time.Duration
	window time.Duration
	limit  uint32
}

// boundary runs the boundary scenario through alg for every window and
// limit of the trace and returns the worst window seen.
func boundary(alg string) boundaryResult {
	var worst boundaryResult
	for _, w := range windows {
		for _, limit := range limits {
			if r := boundaryCase(alg, limit, w); r.ratio > worst.ratio {
				worst = r
			}
		}
	}
	return worst
}

// boundaryCase is the boundary scenario for one limit and window: a window
// of silence, L hits at the last microsecond of the next, then a request
// every W/(100·L) for a window.
func boundaryCase(alg string, limit uint32, w time.Duration) boundaryResult {
	wu := w.Microseconds()
	l := newLimiter(alg, limit, w)
	ww := worstWindow{w: wu, limit: limit}
	end := t0 + 2*wu - 1
	if l.take(end, uint64(limit)) {
		ww.admit(end, int(limit))
	}
	step := max(wu/(100*int64(limit)), 1)
	for at := end + step; at < end+wu; at += step {
		if l.take(at, 1) {
			ww.admit(at, 1)
		}
	}
	return boundaryResult{ratio: ww.worst, most: ww.most, span: time.Duration(ww.span) * time.Microsecond, window: w, limit: limit}
}

// ring is a FIFO of instants, growing as needed. The zero value is empty.
type ring struct {
	buf        []int64
	head, size int
}

func newRing(n int) ring { return ring{buf: make([]int64, max(n, 4))} }

func (r *ring) len() int     { return r.size }
func (r *ring) first() int64 { return r.buf[r.head] }

func (r *ring) push(t int64) {
	if r.size == len(r.buf) {
		grown := make([]int64, max(2*len(r.buf), 16))
		for i := range r.size {
			grown[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = grown, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = t
	r.size++
}

// dropUpTo drops the instants ≤ t: a hit at e is in (t', t'+W] while
// t' < e, as the sliding log counts it.
func (r *ring) dropUpTo(t int64) {
	for r.size > 0 && r.buf[r.head] <= t {
		r.head = (r.head + 1) % len(r.buf)
		r.size--
	}
}

func pct(n, of int64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.4f%%", 100*float64(n)/float64(of))
}

// write prints the report as Markdown.
func (rep *report) write(w io.Writer) {
	fmt.Fprintf(w, "Trace: seed %d, %d clients, %d requests (steady %d, Poisson %d, bursty %d); each client %d windows long; window 1 s to 5 min, limit 10 to 200, rate %g to %g times the limit.\n\n",
		rep.opts.Seed, rep.clients, rep.requests, rep.patterns[steady], rep.patterns[poisson], rep.patterns[bursty], windowsPerClient, rep.opts.MinLoad, rep.opts.MaxLoad)
	fmt.Fprintln(w, "Every request counts (Cloudflare's setting; rls with count_denied_hits): each decision against the exact count of the same requests.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| algorithm | wrongly allowed | wrongly denied | mean rate error |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for a, alg := range measured {
		t := &rep.tallies[a]
		fmt.Fprintf(w, "| `%s` | %s | %s | %.2f%% |\n", alg, pct(t.wronglyAllowed, t.requests), pct(t.wronglyDenied, t.requests),
			100*t.relErrSum/float64(max(t.relErrN, 1)))
	}
	fmt.Fprintln(w, "| Cloudflare's sliding window (400M requests, 270,000 sources) | 0.003% allowed or denied wrongly | | 6% |")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "By pattern (wrongly allowed / wrongly denied):")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| algorithm | %s | %s | %s |\n", patternNames[steady], patternNames[poisson], patternNames[bursty])
	fmt.Fprintln(w, "|---|---|---|---|")
	for a, alg := range measured {
		fmt.Fprintf(w, "| `%s` |", alg)
		for _, pp := range rep.tallies[a].perPattern {
			fmt.Fprintf(w, " %s / %s |", pct(pp[1], pp[0]), pct(pp[2], pp[0]))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Only admitted hits count (rls's default): each algorithm on its own history, against the sliding log (exact) on the same trace.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| algorithm | admitted, of the exact | decided otherwise | worst window, trace | worst window, boundary scenario |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for a, alg := range measured {
		t := &rep.tallies[a]
		b := t.boundary
		fmt.Fprintf(w, "| `%s` | %.2f%% | %s | %.2f× | %.2f×: %d admitted within %s (limit %d per %s) |\n",
			alg, 100*float64(t.admitted)/float64(max(t.exactAdmitted, 1)), pct(t.differs, t.requests), t.worst,
			b.ratio, b.most, b.span, b.limit, b.window)
	}
	fmt.Fprintf(w, "| `sliding_log` | 100%% | 0 | %.2f× | 1.00× |\n", rep.logWorst)
	fmt.Fprintln(w)
	var parts []string
	for _, alg := range append(measured[:len(measured):len(measured)], engine.SlidingLog) {
		b := boundaryCase(alg, 4, 4*time.Second)
		parts = append(parts, fmt.Sprintf("`%s` admits %d within %s (%.2f×)", alg, b.most, b.span, b.ratio))
	}
	fmt.Fprintf(w, "The review's case, 4 per 4 s, in the boundary scenario: %s.\n", strings.Join(parts, ", "))
}
