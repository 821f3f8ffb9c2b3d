// Command tokenbudget measures how far concurrent LLM requests push a
// token budget past its limit, with the two ways rls can keep one: a check
// of one hit when the request comes and its tokens charged when its
// stream ends (count_denied_hits, what Envoy Gateway and Envoy AI Gateway
// send), and a reservation (reserve: {estimate, ttl}: the request's call
// holds the estimate, the stream-end call with the same id settles it with
// the tokens used). It replays a seeded trace through the memory store on
// a virtual clock (the store conformance suite holds every store to the
// same answers) and prints a Markdown table for the README.
//
//	go run ./bench/tokenbudget [-tenants 100] [-minutes 60] [-seed 1]
//
// Each tenant has a budget of B tokens a minute (a fixed window). Its
// requests arrive as a Poisson process at load × B tokens a minute (load
// log-uniform between -min-load and -max-load), each with tokens drawn from
// a Pareto distribution (tail index -alpha, from -min-tokens) cut at
// -max-tokens (the requests' max_tokens, an upper bound), and a duration
// of 0.3 s plus its tokens at 100 to 400 tokens a second: seconds, a
// minute or more for the longest. Many requests of a tenant are in flight
// at once. A request's tokens are used when its stream ends, in that
// window: for each tenant and window the table reports what was used
// against B.
//
// The bound that reservations give (engine/reservation.go): in every
// window, the tokens used pass B by at most the sum, over the requests
// that settled in it, of (tokens − estimate)+; 0 when the estimate is an
// upper bound. The program checks it in every window of every tenant and
// exits 1 when it fails.
package main

import (
	"cmp"
	"container/heap"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/memstore"
)

func main() {
	opts := defaultOptions()
	flag.IntVar(&opts.Tenants, "tenants", opts.Tenants, "tenants, each with its own budget")
	flag.IntVar(&opts.Minutes, "minutes", opts.Minutes, "minutes of arrivals (budget windows); the requests in flight at the end still settle")
	flag.Uint64Var(&opts.Seed, "seed", opts.Seed, "the trace's seed: the same seed gives the same trace and figures")
	flag.Uint64Var(&opts.Budget, "budget", opts.Budget, "a tenant's tokens a minute")
	flag.Float64Var(&opts.MinTokens, "min-tokens", opts.MinTokens, "the fewest tokens of a request (the Pareto distribution's scale)")
	flag.Float64Var(&opts.MaxTokens, "max-tokens", opts.MaxTokens, "the most tokens of a request (its max_tokens: the estimate that is an upper bound)")
	flag.Float64Var(&opts.Alpha, "alpha", opts.Alpha, "the tail index of the requests' tokens (smaller: heavier tail)")
	flag.Func("estimates", "comma-separated estimates of the last rows, below the tokens of the largest requests (default 4000,1000)", func(v string) error {
		opts.Estimates = nil
		for f := range strings.SplitSeq(v, ",") {
			e, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return err
			}
			opts.Estimates = append(opts.Estimates, e)
		}
		return nil
	})
	flag.Float64Var(&opts.MinLoad, "min-load", opts.MinLoad, "the least demand of a tenant, as a multiple of its budget")
	flag.Float64Var(&opts.MaxLoad, "max-load", opts.MaxLoad, "the greatest demand of a tenant, as a multiple of its budget")
	flag.Parse()
	if err := opts.check(); err != nil {
		fmt.Fprintln(os.Stderr, "tokenbudget:", err)
		os.Exit(2)
	}
	start := time.Now()
	rep, err := run(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tokenbudget:", err)
		os.Exit(1)
	}
	rep.write(os.Stdout)
	fmt.Fprintf(os.Stderr, "tokenbudget: %d requests × %d rows in %s\n", rep.requests, len(rep.rows), time.Since(start).Round(time.Millisecond))
	if v := rep.violations(); v != "" {
		fmt.Fprintln(os.Stderr, "tokenbudget: the bound failed:", v)
		os.Exit(1)
	}
}

// options are what a run depends on.
type options struct {
	Tenants, Minutes     int
	Seed                 uint64
	Budget               uint64
	MinTokens, MaxTokens float64
	Alpha                float64
	Estimates            []uint64
	MinLoad, MaxLoad     float64
}

func defaultOptions() options {
	return options{Tenants: 50, Minutes: 60, Seed: 1, Budget: 100_000, MinTokens: 300, MaxTokens: 16_000, Alpha: 1.3,
		Estimates: []uint64{4000, 1000}, MinLoad: 0.5, MaxLoad: 4}
}

func (o options) check() error {
	switch {
	case o.Tenants < 1 || o.Minutes < 1:
		return fmt.Errorf("-tenants %d, -minutes %d: want at least 1 of each", o.Tenants, o.Minutes)
	case o.Budget < 1 || o.Budget > math.MaxUint32:
		return fmt.Errorf("-budget %d: want 1 to %d", o.Budget, uint64(math.MaxUint32))
	case !(o.MinTokens >= 1) || !(o.MaxTokens > o.MinTokens) || o.MaxTokens > float64(o.Budget):
		return fmt.Errorf("-min-tokens %g, -max-tokens %g: want 1 ≤ min < max ≤ the budget %d", o.MinTokens, o.MaxTokens, o.Budget)
	case !(o.Alpha > 0):
		return fmt.Errorf("-alpha %g: want more than 0", o.Alpha)
	case slices.ContainsFunc(o.Estimates, func(e uint64) bool { return e < 1 || e > o.Budget }):
		return fmt.Errorf("-estimates %v: want each 1 to the budget %d", o.Estimates, o.Budget)
	case !(o.MinLoad > 0) || !(o.MaxLoad >= o.MinLoad):
		return fmt.Errorf("-min-load %g, -max-load %g: want 0 < min ≤ max", o.MinLoad, o.MaxLoad)
	}
	return nil
}

// window is the budget's window; t0 the trace's start, aligned to it
// (fixed windows are aligned to the epoch).
const window = time.Minute

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// request is one request of the trace.
type request struct {
	tenant int
	at     time.Duration // arrival, since t0
	dur    time.Duration
	tokens uint64
}

// trace draws the requests of every tenant, by arrival (then tenant).
func trace(opts options) []request {
	mean := paretoMean(opts.Alpha, opts.MinTokens, opts.MaxTokens)
	horizon := time.Duration(opts.Minutes) * window
	var out []request
	for tn := range opts.Tenants {
		rng := rand.New(rand.NewPCG(opts.Seed, uint64(tn)))
		load := opts.MinLoad * math.Exp(rng.Float64()*math.Log(opts.MaxLoad/opts.MinLoad))
		perSecond := load * float64(opts.Budget) / mean / window.Seconds()
		for t := rng.ExpFloat64() / perSecond; t < horizon.Seconds(); t += rng.ExpFloat64() / perSecond {
			tokens := pareto(rng, opts.Alpha, opts.MinTokens, opts.MaxTokens)
			speed := 100 + 300*rng.Float64() // tokens a second
			dur := 0.3 + tokens/speed
			out = append(out, request{tenant: tn, at: seconds(t), dur: seconds(dur), tokens: uint64(tokens)})
		}
	}
	slices.SortStableFunc(out, func(a, b request) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.tenant, b.tenant))
	})
	return out
}

// seconds is s as a duration in whole µs (the stores' resolution).
func seconds(s float64) time.Duration { return time.Duration(s*1e6) * time.Microsecond }

// pareto draws from a Pareto distribution of tail index alpha and scale lo,
// cut at hi (inverse transform of the truncated distribution).
func pareto(rng *rand.Rand, alpha, lo, hi float64) float64 {
	u := rng.Float64()
	return lo / math.Pow(1-u*(1-math.Pow(lo/hi, alpha)), 1/alpha)
}

// paretoCDF is the share of pareto(alpha, lo, hi) at most x.
func paretoCDF(x, alpha, lo, hi float64) float64 {
	x = min(max(x, lo), hi)
	return (1 - math.Pow(lo/x, alpha)) / (1 - math.Pow(lo/hi, alpha))
}

// paretoMean is the mean of pareto(alpha, lo, hi).
func paretoMean(alpha, lo, hi float64) float64 {
	norm := 1 - math.Pow(lo/hi, alpha)
	if alpha == 1 {
		return lo * math.Log(hi/lo) / norm
	}
	return alpha * math.Pow(lo, alpha) * (math.Pow(hi, 1-alpha) - math.Pow(lo, 1-alpha)) / ((1 - alpha) * norm)
}

// mode is one row of the table: how requests are sent.
type mode struct {
	name     string
	open     bool // no budget: every request admitted (the demand)
	reserve  bool
	estimate uint64 // reserve only
}

// row is what one mode did over the trace.
type row struct {
	mode
	admitted     int
	unheld       int     // settles whose hold was not found (none expected: the ttl outlives every request)
	used         float64 // the mean, over tenant windows, of tokens used / budget
	over         int     // tenant windows whose tokens used passed the budget
	worst        uint64  // the most tokens used past the budget in a tenant window
	worstBound   uint64  // the bound in that window
	maxBound     uint64  // the largest bound of any window
	broken       int     // windows past their bound (reserve only; must be 0)
	brokenSample string
}

// report is the table.
type report struct {
	opts     options
	requests int
	windows  int // tenant windows measured
	rows     []row
}

// run replays the trace under each mode.
func run(opts options) (*report, error) {
	reqs := trace(opts)
	rep := &report{opts: opts, requests: len(reqs)}
	modes := []mode{
		{name: "no budget (the demand)", open: true},
		{name: "count_denied_hits: 1 hit checked, tokens charged at the end"},
		{name: fmt.Sprintf("reserve, estimate %d (max_tokens: an upper bound)", uint64(opts.MaxTokens)), reserve: true, estimate: uint64(opts.MaxTokens)},
	}
	for _, e := range opts.Estimates {
		modes = append(modes, mode{name: fmt.Sprintf("reserve, estimate %d (%.0f %% of requests fit it)", e, 100*paretoCDF(float64(e), opts.Alpha, opts.MinTokens, opts.MaxTokens)), reserve: true, estimate: e})
	}
	for _, m := range modes {
		r, windows, err := replay(opts, reqs, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		rep.windows = windows
		rep.rows = append(rep.rows, r)
	}
	return rep, nil
}

// ending is a request in flight, by the instant its stream ends (then its
// index in the trace).
type ending struct {
	end time.Duration
	i   int
}

type endings []ending

func (h endings) Len() int { return len(h) }
func (h endings) Less(a, b int) bool {
	return h[a].end < h[b].end || h[a].end == h[b].end && h[a].i < h[b].i
}
func (h endings) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *endings) Push(x any)   { *h = append(*h, x.(ending)) }
func (h *endings) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// replay sends the trace's requests to a fresh memory store under m, in
// the order of their instants (a stream's end before an arrival at the
// same instant), and measures each tenant window.
func replay(opts options, reqs []request, m mode) (row, int, error) {
	now := t0
	store := memstore.New(memstore.Options{Now: func() time.Time { return now }, MaxBytes: 1 << 30, SweepEvery: time.Hour})
	defer store.Close()
	spec := engine.Spec{Algorithm: engine.FixedWindow, Limit: uint32(opts.Budget), Unit: engine.Minute, Multiplier: 1}
	if m.reserve {
		spec.Reserve = engine.Some(engine.Reserve{Estimate: uint32(m.estimate), TTL: 10 * time.Minute})
	}
	rule, errs := engine.Compile(spec)
	if len(errs) > 0 {
		return row{}, 0, fmt.Errorf("the budget's rule: %v", errs)
	}
	descs := make([]string, opts.Tenants)
	for tn := range descs {
		descs[tn] = "tenant=" + strconv.Itoa(tn)
	}
	type tally struct{ used, bound uint64 }
	windows := opts.Minutes
	tallies := make([]map[int]*tally, opts.Tenants) // by window index
	for tn := range tallies {
		tallies[tn] = map[int]*tally{}
	}
	out := row{mode: m}
	items, results := make([]engine.Item, 1), make([]engine.Result, 1)
	call := func(at time.Duration, it engine.Item) (engine.Result, error) {
		now = t0.Add(at)
		items[0] = it
		if _, err := store.Apply(context.Background(), items, results); err != nil {
			return engine.Result{}, err
		}
		return results[0], nil
	}
	// end settles (or charges) the tokens of request i, used at its end.
	end := func(i int) error {
		r := &reqs[i]
		at := r.at + r.dur
		it := engine.Item{Desc: descs[r.tenant], Rule: rule, Hits: r.tokens}
		if m.reserve {
			it.Reservation = strconv.Itoa(i)
		} else {
			it.CountDenied = true
		}
		if !m.open {
			res, err := call(at, it)
			if err != nil {
				return err
			}
			if m.reserve && res.Phase != engine.Settling {
				out.unheld++
			}
		}
		w := int(at / window)
		t := tallies[r.tenant][w]
		if t == nil {
			t = &tally{}
			tallies[r.tenant][w] = t
		}
		t.used += r.tokens
		if m.reserve && r.tokens > m.estimate {
			t.bound += r.tokens - m.estimate
		}
		return nil
	}
	var inFlight endings
	for i := range reqs {
		r := &reqs[i]
		for len(inFlight) > 0 && inFlight[0].end <= r.at {
			if err := end(heap.Pop(&inFlight).(ending).i); err != nil {
				return row{}, 0, err
			}
		}
		it := engine.Item{Desc: descs[r.tenant], Rule: rule, Hits: 1}
		if m.reserve {
			it.Reservation = strconv.Itoa(i)
		} else {
			it.CountDenied = true
		}
		admitted := m.open
		if !m.open {
			res, err := call(r.at, it)
			if err != nil {
				return row{}, 0, err
			}
			admitted = res.Admitted
		}
		if admitted {
			out.admitted++
			heap.Push(&inFlight, ending{r.at + r.dur, i})
		}
	}
	for len(inFlight) > 0 {
		if err := end(heap.Pop(&inFlight).(ending).i); err != nil {
			return row{}, 0, err
		}
	}
	// Every window of every tenant: those of the trace (used or not) and
	// those after it where requests still ended.
	var usedSum float64
	measured := 0
	for tn := range tallies {
		for w := range windows {
			if _, ok := tallies[tn][w]; !ok {
				tallies[tn][w] = &tally{}
			}
		}
		for w, t := range tallies[tn] {
			if w < windows {
				usedSum += float64(t.used) / float64(opts.Budget)
				measured++
			}
			out.maxBound = max(out.maxBound, t.bound)
			if t.used <= opts.Budget {
				continue
			}
			over := t.used - opts.Budget
			if w < windows {
				out.over++
			}
			if over > out.worst || over == out.worst && t.bound < out.worstBound {
				out.worst, out.worstBound = over, t.bound
			}
			if m.reserve && over > t.bound {
				out.broken++
				out.brokenSample = fmt.Sprintf("tenant %d, minute %d: %d tokens used of %d, past the bound %d", tn, w, t.used, opts.Budget, t.bound)
			}
		}
	}
	out.used = usedSum / float64(measured)
	return out, measured, nil
}

// violations names the rows whose bound failed, "" when none did.
func (r *report) violations() string {
	var s string
	for _, row := range r.rows {
		if row.broken > 0 || row.unheld > 0 {
			s += fmt.Sprintf("%s: %d windows past the bound (%s), %d settles without their hold; ", row.name, row.broken, row.brokenSample, row.unheld)
		}
	}
	return s
}

// write prints the table as Markdown.
func (r *report) write(w io.Writer) {
	o := r.opts
	fmt.Fprintf(w, "%d tenants, a budget of %d tokens a minute each, %d minutes (%d tenant windows), %d requests (load %g–%g× the budget; tokens Pareto α %g from %g, at most %g; seed %d)\n\n",
		o.Tenants, o.Budget, o.Minutes, r.windows, r.requests, o.MinLoad, o.MaxLoad, o.Alpha, o.MinTokens, o.MaxTokens, o.Seed)
	fmt.Fprintln(w, "| mode | requests admitted | tokens used / budget (mean of tenant minutes) | tenant minutes over budget | worst overrun of a tenant minute | its bound Σ(tokens − estimate)+ |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, row := range r.rows {
		bound := "none"
		if row.reserve {
			bound = strconv.FormatUint(row.worstBound, 10)
		}
		fmt.Fprintf(w, "| %s | %.1f %% | %.1f %% | %.2f %% | %d tokens (%.1f %% of the budget) | %s |\n",
			row.name, 100*float64(row.admitted)/float64(r.requests), 100*row.used, 100*float64(row.over)/float64(r.windows),
			row.worst, 100*float64(row.worst)/float64(o.Budget), bound)
	}
}
