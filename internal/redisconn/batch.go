package redisconn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends the requests of concurrent calls together: each of its
// workers takes every call queued at that moment (up to maxBatch) and sends
// them in one round trip, so that under load a round trip carries many
// requests. With little load a call goes alone and waits for nobody.
//
// On a single node the calls of a round trip share FCALLs too: the
// function (Options.Function) takes several requests (up to perScript) and
// runs them one after the other, so Redis pays a call's fixed cost once
// for all of them. In a cluster, where each call goes to the node of its
// keys, every call is an FCALL of its own in a pipeline, and a worker sends
// the calls of each node on its own connection to that node, concurrently.
//
// Gathering. On a single node a worker whose batch is not full does not
// send it while another worker's pipeline is in flight: it gathers the
// calls queued meanwhile into it until that pipeline is back (see gather),
// so that under load a round trip carries the calls of a whole round trip
// of the one before, and Redis, which pays a round trip's reading and
// writing once, spends less per request. A pipeline out for longer than
// gatherSpan holds nobody: a slow or stalled one does not stop the others.
// A call that finds no pipeline in flight goes at once.
//
// Connections. Each worker sends on connections of its own (links), set up
// before the worker stamps the deadlines of the calls it sends on them: a
// dial, a TLS handshake, a reconnection are never part of a call's budget.
// A call to a node that cannot be connected fails at once, with nothing
// sent.
//
// Deadlines. A call is sent with a deadline in the node's clock (see
// redisClock): its send instant plus its budget, the store timeout or, when
// its caller waits less than the timeout and its grace, the same share of
// the caller's wait (the rest is for the reply's way back). Past it the
// function runs nothing of the request (Request.Head: expired), and the
// call is sent again while its caller waits (resend). Its caller waits for
// the reply until the deadline plus grace, or its own deadline; a reply
// that arrives after its caller stopped waiting is late (Options.OnLate):
// what it did is the caller's to undo, with the undo log that the function
// attaches to requests it runs within the last undoSpan before their
// deadline, the only ones whose replies can be late unless the way back
// takes longer than a whole budget. A call whose reply never came (the
// connection failed, or stayed silent past the drain bound: see sendNode)
// is indeterminate (Options.OnIndeterminate): nobody can tell or undo
// what it did.
type batcher struct {
	links     *links
	queue     chan *call
	maxBatch  int
	perScript int
	clock     *redisClock // nil: no deadlines (the function runs on a test clock)
	timeout   time.Duration
	bound     time.Duration // pipelineBound
	drain     time.Duration // drainBound
	fn        string        // the function called (Options.Function)
	library   string        // the library that defines it (Options.Library)
	late      func(Late)    // a reply whose caller stopped waiting
	unknown   func(node string, err error)
	flying    *flights // nil: workers send at once (a cluster)

	scripts, roundTrips atomic.Uint64
	resent              atomic.Uint64 // calls sent again (resend)

	stop    chan struct{}
	workers sync.WaitGroup
	wg      sync.WaitGroup // the flights' runners (run)

	mu      sync.Mutex
	running map[*flight]struct{} // the flights whose runners run; guarded by mu
}

// For a request that Redis has budget to run: grace is how long its
// caller waits for the reply past the deadline, for the reply's way back;
// undoSpan is how long before the deadline a run carries its undo log.
func grace(budget time.Duration) time.Duration    { return budget / 2 }
func undoSpan(budget time.Duration) time.Duration { return budget / 2 }

// gatherSpan is how long a pipeline in flight makes the other workers
// gather (see batcher): far more than a round trip to a Redis that keeps
// up, a small share of the budget of the calls that wait.
func gatherSpan(timeout time.Duration) time.Duration { return timeout / 4 }

// budget is how long Redis has to run c, sent at sent: the timeout, or,
// when c's caller waits less than the timeout and its grace, the same
// share of the caller's wait. (A caller that waits 18 ms, Envoy's 20 less
// rls's answer margin, with a store timeout of a second, gets a
// deadline 12 ms on; a deadline the whole timeout's grace, 500 ms, before
// its own would be in the past, and every such request would expire.)
func (b *batcher) budget(c *call, sent time.Time) time.Duration {
	cd, ok := c.ctx.Deadline()
	if !ok {
		return b.timeout
	}
	full := b.timeout + grace(b.timeout)
	if wait := cd.Sub(sent); wait < full {
		return time.Duration(float64(wait) * float64(b.timeout) / float64(full))
	}
	return b.timeout
}

// pipelineBound is how long a worker waits for a pipeline's replies: far
// past the callers' wait, so that late replies are read and given back.
// Past it the worker goes on, and the pipeline reads on until drainBound.
func pipelineBound(opts Options) time.Duration {
	return max(5*opts.Timeout, opts.MinPipelineBound)
}

// drainBound is how long a pipeline reads its replies in all: past its
// bound (pipelineBound) its worker goes on without it, and replies that
// come meanwhile are read, late, until then (a Redis paused for less than
// that says which requests it ran past their deadlines).
func drainBound(opts Options) time.Duration {
	return 10 * pipelineBound(opts)
}

// A call's state is its status, and while it is pending the number of
// times it was sent (its send), packed in one word so that each change is
// one compare-and-swap: it is answered once, by the worker (a reply or an
// error), by the wait timer of the send it is at, or abandoned by its
// caller; or, pending still, queued for another send (resend).
const (
	pending int32 = iota
	answered
	abandoned

	statusBits = 2
	statusMask = 1<<statusBits - 1
)

// maxSends bounds how many times one call is sent: a call that Redis
// refused as past its deadline (nothing done) goes again while its
// caller waits long enough, at most this often in all.
const maxSends = 3

type call struct {
	ctx    context.Context
	onSent func(at time.Time, pipeline int) // the caller's, nil for none
	node   string                           // the node's address, for its clock and links ("" on a single node)
	keys   []string
	req    Request
	done   chan struct{} // closed when answered
	state  atomic.Int32  // status | sends<<statusBits
	// written by whoever answers, before done is closed
	reply any
	err   error

	// asking: sent right after ASKING, to a cluster node that imports the
	// call's slot (each call is an FCALL of its own in a cluster)
	asking bool
}

// status returns the call's status: pending, answered or abandoned.
func (c *call) status() int32 { return c.state.Load() & statusMask }

// answer delivers reply or err to the caller, unless it has already been
// answered or abandoned; it reports whether it did.
func (c *call) answer(r any, err error) bool {
	for {
		s := c.state.Load()
		if s&statusMask != pending {
			return false
		}
		if c.state.CompareAndSwap(s, answered) {
			c.reply, c.err = r, err
			close(c.done)
			return true
		}
	}
}

// answerSend is answer for the wait timer of a call's send number send:
// a call sent again since is another send's to answer.
func (c *call) answerSend(send int32, r any, err error) bool {
	if !c.state.CompareAndSwap(pending|send<<statusBits, answered) {
		return false
	}
	c.reply, c.err = r, err
	close(c.done)
	return true
}

// abandon marks the call given up by its caller, unless it has been
// answered; it reports whether it did.
func (c *call) abandon() bool {
	for {
		s := c.state.Load()
		if s&statusMask != pending {
			return false
		}
		if c.state.CompareAndSwap(s, abandoned) {
			return true
		}
	}
}

// sends returns how many times the call has been sent (while pending).
func (c *call) sends() int32 { return c.state.Load() >> statusBits }

// markSend records one more send of a pending call and returns its
// number; false when the call is no longer pending.
func (c *call) markSend() (int32, bool) {
	for {
		s := c.state.Load()
		if s&statusMask != pending {
			return 0, false
		}
		n := s>>statusBits + 1
		if c.state.CompareAndSwap(s, pending|n<<statusBits) {
			return n, true
		}
	}
}

// newBatcher starts the workers of opts (whose defaults are set), each
// sending up to perScript requests per FCALL, waiting bound for a
// pipeline (pipelineBound), gathering calls while another worker's
// pipeline flies when gathering (a single node).
func newBatcher(links *links, opts Options, perScript int, bound time.Duration, clock *redisClock, gathering bool) *batcher {
	b := &batcher{
		links:     links,
		queue:     make(chan *call, 16*opts.MaxBatch),
		maxBatch:  opts.MaxBatch,
		perScript: perScript,
		clock:     clock,
		timeout:   opts.Timeout,
		bound:     bound,
		drain:     drainBound(opts),
		fn:        opts.Function,
		library:   opts.Library,
		late:      opts.OnLate,
		unknown:   opts.OnIndeterminate,
		stop:      make(chan struct{}),
		running:   make(map[*flight]struct{}),
	}
	if gathering {
		b.flying = newFlights(opts.Workers, gatherSpan(opts.Timeout))
	}
	for i := range opts.Workers {
		b.workers.Go(func() { b.work(i) })
	}
	return b
}

// close stops the workers, then the runners of their flights, once each
// has read the replies of the pipeline it runs.
func (b *batcher) close() {
	close(b.stop)
	b.workers.Wait() // from here on nobody sends
	b.mu.Lock()
	for f := range b.running {
		f.end()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// errClosed is returned by calls on a Conn drained or closed.
var errClosed = errors.New("redis: the connection is closed (nothing sent)")

// errNoReply is the error of a call whose reply did not come within its
// deadline and grace: it may or may not have run.
var errNoReply = errors.New("redis: no reply within the store timeout")

// do runs one request on node (keys: the FCALL's keys; asking: sent
// after ASKING) and returns the function's reply to it; onSent, when not
// nil, is told when the request is sent.
func (b *batcher) do(ctx context.Context, node string, keys []string, asking bool, req Request, onSent func(time.Time, int)) (any, error) {
	select {
	case <-b.stop: // closed: a free queue slot must not win the select below
		return nil, errClosed
	default:
	}
	c := &call{ctx: ctx, onSent: onSent, node: node, keys: keys, asking: asking, req: req, done: make(chan struct{})}
	c.state.Store(pending | 1<<statusBits) // its first send
	select {
	case b.queue <- c:
	case <-ctx.Done():
		return nil, fmt.Errorf("redis: queueing: %w", ctx.Err())
	case <-b.stop:
		return nil, errClosed
	}
	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		if c.abandon() {
			// Not sent yet, it never will be; sent, its reply will be
			// late (OnLate).
			return nil, fmt.Errorf("redis: %w", ctx.Err())
		}
		<-c.done // answered meanwhile
		return c.reply, c.err
	}
}

// work is worker number worker: it sends batches on its own links. When
// gathering, the workers take turns at the queue (flights.turn): the one
// whose turn it is takes the calls queued, waits while another pipeline
// flies (gather) and takes those queued meanwhile; then it hands the turn
// on and sends.
func (b *batcher) work(worker int) {
	batch := make([]*call, 0, b.maxBatch)
	var timer *time.Timer
	if b.flying != nil {
		timer = time.NewTimer(time.Hour)
		timer.Stop()
	}
	for {
		if b.flying != nil {
			select {
			case b.flying.turn <- struct{}{}:
			case <-b.stop:
				return
			}
		}
		select {
		case <-b.stop:
			b.handOn()
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
		batch = b.fill(batch)
		if b.flying != nil && len(batch) < b.maxBatch && b.gather(timer) {
			batch = b.fill(batch)
		}
		b.handOn()
		b.send(worker, batch)
		clear(batch)
	}
}

// fill adds to batch the calls queued, up to maxBatch, and returns it.
func (b *batcher) fill(batch []*call) []*call {
	for len(batch) < b.maxBatch {
		select {
		case c := <-b.queue:
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}

// handOn ends the turn of a gathering worker at the queue.
func (b *batcher) handOn() {
	if b.flying != nil {
		<-b.flying.turn
	}
}

// gather waits while another worker's pipeline is in flight, until one
// comes back or none has left within the gather span (see batcher), with
// timer (stopped); it reports whether it waited.
func (b *batcher) gather(timer *time.Timer) bool {
	back, until := b.flying.wait()
	if back == nil {
		return false
	}
	d := time.Until(until)
	if d <= 0 {
		return false
	}
	timer.Reset(d)
	defer timer.Stop()
	select {
	case <-back:
	case <-timer.C:
	case <-b.stop:
	}
	return true
}

// flights are the pipelines of a batcher's workers in flight, for their
// gathering (batcher.gather). Safe for concurrent use.
type flights struct {
	span time.Duration // a pipeline out for longer holds nobody
	turn chan struct{} // the turn at the queue: held by one worker at a time

	mu   sync.Mutex
	out  []time.Time   // per worker, when its pipeline left; zero when none is out
	n    int           // pipelines out
	calm chan struct{} // closed when one comes back
	last time.Time     // when the last out left
}

func newFlights(workers int, span time.Duration) *flights {
	return &flights{span: span, turn: make(chan struct{}, 1), out: make([]time.Time, workers)}
}

// leave records worker's pipeline sent at sent.
func (f *flights) leave(worker int, sent time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.out[worker] = sent
	if f.n++; f.n == 1 {
		f.calm = make(chan struct{})
	}
	f.newest()
}

// back records worker's pipeline back (or given up by its worker).
func (f *flights) back(worker int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.out[worker] = time.Time{}
	f.n--
	close(f.calm)
	if f.n > 0 {
		f.calm = make(chan struct{})
	}
	f.newest()
}

func (f *flights) newest() {
	f.last = time.Time{}
	for _, t := range f.out {
		if t.After(f.last) {
			f.last = t
		}
	}
}

// wait returns, while a pipeline is out, a channel closed when one comes
// back, and when those out stop holding the others (the gather span after
// the last left); nil when none is out.
func (f *flights) wait() (<-chan struct{}, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return nil, time.Time{}
	}
	return f.calm, f.last.Add(f.span)
}

// send sends a batch: the calls of each node on worker's link to it, the
// nodes concurrently.
func (b *batcher) send(worker int, batch []*call) {
	batch = unanswered(batch)
	if len(batch) == 0 {
		return
	}
	if oneNode(batch) {
		b.sendNode(worker, batch)
		return
	}
	var nodes []string
	byNode := make(map[string][]*call)
	for _, c := range batch {
		if _, ok := byNode[c.node]; !ok {
			nodes = append(nodes, c.node)
		}
		byNode[c.node] = append(byNode[c.node], c)
	}
	var wg sync.WaitGroup
	for _, node := range nodes {
		wg.Go(func() { b.sendNode(worker, byNode[node]) })
	}
	wg.Wait()
}

// oneNode reports whether calls all go to one node.
func oneNode(calls []*call) bool {
	for _, c := range calls {
		if c.node != calls[0].node {
			return false
		}
	}
	return true
}

// sendNode runs calls, all to one node, in one pipeline of FCALLs on
// worker's link to the node, each carrying up to perScript calls. The link
// is set up first, if need be, and only then are the deadlines stamped.
func (b *batcher) sendNode(worker int, calls []*call) {
	l, err := b.links.take(calls[0].node, worker)
	if err != nil {
		for _, c := range calls {
			c.answer(nil, err) // nothing sent
		}
		return
	}
	defer b.links.give(l)
	// Answered or abandoned while the link was set up: not sent.
	if calls = unanswered(calls); len(calls) == 0 {
		return
	}
	sent := time.Now()
	b.setDeadlines(calls, sent)
	markSent(calls, sent)
	b.fly(worker, l, calls, sent)
}

// fly runs the pipeline of calls on l in the runner of l's flight (run),
// and waits for it up to the bound. Past it (a node paused, partitioned,
// lost), the worker goes on with a new connection (and flight), and the
// pipeline keeps this one and reads its replies for as long as the drain
// bound, late: a request that Redis runs late, past its deadline, says
// that it did nothing (expired), and one that it ran is told to OnLate;
// only one whose reply never comes is indeterminate. The pipeline gets its
// own copy of the calls: it may outlive the worker's batch, which the
// worker clears and refills. Requires l held, worker's.
func (b *batcher) fly(worker int, l *link, calls []*call, sent time.Time) {
	f := l.flight()
	f.state.Store(pending)
	if !f.started {
		f.started = true
		b.mu.Lock()
		b.running[f] = struct{}{}
		b.mu.Unlock()
		b.wg.Go(func() { b.run(f) })
	}
	f.jobs <- job{client: l.client, socket: l.rawSocket(), calls: slices.Clone(calls), sent: sent}
	if b.flying != nil {
		b.flying.leave(worker, sent)
		defer b.flying.back(worker)
	}
	f.bound.Reset(b.bound)
	select {
	case broken := <-f.done:
		f.bound.Stop()
		if broken {
			l.broken()
		}
	case <-f.bound.C:
		if f.state.CompareAndSwap(pending, abandoned) {
			l.handOff()
		} else if <-f.done {
			l.broken()
		}
	}
}

// flight is what a worker and the pipelines it sends on a link share (see
// fly): the runner of the pipelines, whether the worker still waits for
// the one in flight (pending), its outcome, and the worker's timer. A link
// keeps one for its pipelines, and gets a new one when a pipeline is
// handed off with its own.
type flight struct {
	jobs    chan job     // the pipeline to run, one at a time; closed by end
	ended   sync.Once    // jobs closed
	started bool         // its runner started; guarded by the link's held
	state   atomic.Int32 // pending, answered (the pipeline ended), abandoned (handed off)
	done    chan bool    // the pipeline's broken, when it ended first
	bound   *time.Timer  // stopped between pipelines
}

func newFlight() *flight {
	f := &flight{jobs: make(chan job, 1), done: make(chan bool, 1), bound: time.NewTimer(time.Hour)}
	f.bound.Stop()
	return f
}

// end ends f's runner once it has run the pipeline it runs, if any: when
// the workers stop, or the link's node is retired. Nobody sends on f
// after (the link's held is taken, or the workers have stopped).
func (f *flight) end() { f.ended.Do(func() { close(f.jobs) }) }

// job is a pipeline for a flight's runner: calls, sent at sent on client
// (whose socket is socket, see pipeline).
type job struct {
	client *redis.Client
	socket syscall.RawConn
	calls  []*call
	sent   time.Time
}

// run is the runner of flight f: it runs f's pipelines one after the other
// and tells the worker how each ended (f.done), until the worker stops
// waiting for one (handed off: the flight ends with it, and its client is
// closed once its replies are read) or f's jobs are closed. One goroutine
// for a flight's life, where one per pipeline grew a new stack to the
// depth of go-redis's pipeline at every round trip.
func (b *batcher) run(f *flight) {
	defer func() {
		b.mu.Lock()
		delete(b.running, f)
		b.mu.Unlock()
	}()
	for j := range f.jobs {
		broken := b.pipeline(j.client, j.socket, j.calls, j.sent)
		if !f.state.CompareAndSwap(pending, answered) {
			j.client.Close() // handed off
			return
		}
		f.done <- broken
	}
}

// pipeline sends calls (see fly) on client (whose socket is socket, nil
// when it cannot be looked at), reads their replies within the drain bound
// and answers them (late replies go to b.late), and reports whether the
// connection failed or its state is unknown.
func (b *batcher) pipeline(client *redis.Client, socket syscall.RawConn, calls []*call, sent time.Time) (broken bool) {
	// The callers stop waiting at their deadline plus grace, or later while
	// their replies wait to be read on socket (replyWait). The wait answers
	// each call of this send of it (a call sent again is its next send's
	// to answer); it reads calls, which nothing changes (reload works on
	// copies).
	wait := &replyWait{socket: socket, span: b.timeout + grace(b.timeout), bound: b.bound, calls: make([]timedCall, len(calls))}
	for i, c := range calls {
		wait.calls[i] = timedCall{c, c.sends()}
	}
	wait.start(sent)
	defer wait.stop()
	ctx, cancel := context.WithTimeout(context.Background(), b.drain)
	defer cancel()
	scripts := make([]*script, 0, (len(calls)+b.perScript-1)/b.perScript)
	for rest := calls; len(rest) > 0; {
		calls := rest[:min(len(rest), b.perScript)]
		rest = rest[len(calls):]
		scripts = append(scripts, &script{calls: calls, args: scriptArgs(calls)})
	}
	b.exec(ctx, client, scripts, sent)
	b.reload(ctx, client, scripts, wait)
	recv := time.Now()
	for _, sc := range scripts {
		if b.read(sc, recv) {
			broken = true
		}
	}
	return broken
}

// script is one FCALL of a pipeline: the calls it carries, its arguments,
// its command once sent and when its pipeline left (for the clock's
// samples).
type script struct {
	calls []*call
	args  []any
	cmd   *redis.Cmd
	sent  time.Time
}

// exec sends scripts in one pipeline on client, left at sent, and waits for
// their replies (or errors).
func (b *batcher) exec(ctx context.Context, client *redis.Client, scripts []*script, sent time.Time) {
	pipe := client.Pipeline()
	for _, sc := range scripts {
		if sc.calls[0].asking {
			pipe.Do(ctx, "asking") // its reply is OK; a failure fails the FCALL too
		}
		sc.cmd = pipe.FCall(ctx, b.fn, sc.calls[0].keys, sc.args...)
		sc.sent = sent
	}
	pipe.Exec(ctx) // errors are per command
	b.roundTrips.Add(1)
	b.scripts.Add(uint64(len(scripts)))
}

// reload loads the library on client's node when scripts found it
// without (a restarted Redis, a new cluster node: nothing ran), and sends
// those scripts again, with the calls still waiting (the wait timer may
// have answered some while the library loaded): their deadlines, and
// their callers' wait, start again.
func (b *batcher) reload(ctx context.Context, client *redis.Client, scripts []*script, wait *replyWait) {
	var again []*script
	for _, sc := range scripts {
		if notLoaded(sc.cmd.Err()) {
			again = append(again, sc)
		}
	}
	if len(again) == 0 {
		return
	}
	if err := client.FunctionLoadReplace(ctx, b.library).Err(); err != nil {
		// Still Redis's "not found" first: these calls did not run,
		// whatever the load's error (mayHaveRun).
		for _, sc := range again {
			sc.cmd.SetErr(fmt.Errorf("%w; loading the library: %w", sc.cmd.Err(), err))
		}
		return
	}
	sent := time.Now()
	wait.start(sent)
	resend := again[:0]
	for _, sc := range again {
		if sc.calls = unanswered(slices.Clone(sc.calls)); len(sc.calls) > 0 {
			b.setDeadlines(sc.calls, sent)
			markSent(sc.calls, sent)
			sc.args = scriptArgs(sc.calls)
			resend = append(resend, sc)
		}
	}
	if len(resend) > 0 {
		b.exec(ctx, client, resend, sent)
	}
}

// read answers the calls of sc, whose reply came by recv: each its
// element of the reply, sent again when Redis refused it as past its
// deadline and its caller still waits (resend), or told to b.late when its
// caller stopped waiting; each the error of a failed FCALL, told to
// b.unknown when it may have run. It reports whether the connection failed
// or its state is unknown (to be set up again before its next use).
func (b *batcher) read(sc *script, recv time.Time) (broken bool) {
	result, err := sc.cmd.Result()
	replies, ok := result.([]any)
	if err == nil && (!ok || len(replies) != len(sc.calls)) {
		err = fmt.Errorf("unexpected reply of %s: %v", b.fn, result)
	}
	if err != nil {
		for _, c := range sc.calls {
			if mayHaveRun(err) {
				b.unknown(c.node, err)
			}
			c.answer(nil, fmt.Errorf("redis: %w", err))
		}
		return !IsRedisError(err)
	}
	for j, c := range sc.calls {
		now, expired, err := c.req.Head(replies[j])
		if err != nil {
			c.answer(nil, err)
			continue
		}
		if b.clock != nil && j == 0 {
			b.clock.sample(c.node, now, sc.sent, recv)
		}
		if expired && b.resend(c, replies[j]) {
			continue
		}
		if !c.answer(replies[j], nil) {
			b.late(Late{Node: c.node, Keys: c.keys, Request: c.req, Reply: replies[j]})
		}
	}
	return false
}

// timedCall is a call that a replyWait answers, and the number of the
// send it waits for.
type timedCall struct {
	c    *call
	send int32
}

// replyWait answers the calls of a pipeline with errNoReply when their
// replies do not come in time: span (the deadline plus grace) after they
// were sent, or later while bytes of the replies wait on the pipeline's
// connection (socket), unread (the replies came, Redis ran them by their
// deadlines, and rls had no core to read them yet), but never later than
// bound after they were sent. Safe for concurrent use.
type replyWait struct {
	socket      syscall.RawConn // nil: cannot be looked at
	span, bound time.Duration
	calls       []timedCall

	mu      sync.Mutex
	sent    time.Time   // guarded by mu
	t       *time.Timer // guarded by mu
	stopped bool        // guarded by mu
}

// replyPoll is how often a replyWait looks again at replies waiting.
const replyPoll = time.Millisecond

// start (re)arms the wait for calls sent at sent.
func (w *replyWait) start(sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent = sent
	if w.t != nil {
		w.t.Stop()
	}
	w.t = time.AfterFunc(time.Until(sent.Add(w.span)), w.fire)
}

// fire answers the calls, or waits on while bytes of their replies wait.
func (w *replyWait) fire() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	if d := time.Until(w.sent.Add(w.bound)); d > 0 && socketReadable(w.socket) {
		// Looked at again soon: the worker stops the wait once it has read.
		w.t = time.AfterFunc(min(d, replyPoll), w.fire)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	for _, t := range w.calls {
		t.c.answerSend(t.send, nil, errNoReply)
	}
}

// stop ends the wait: the worker has the replies, or their errors.
func (w *replyWait) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.t.Stop()
}

// resend queues again a call that Redis refused as past its deadline
// (nothing was done, so sending it again is safe; expired is that reply),
// and reports whether it did: while its caller waits at least a timeout
// more, and it has been sent fewer than maxSends times. A machine that
// starved Redis of CPU for longer than the budget (a co-located load, a
// throttled container) costs its callers time, then, not an error.
func (b *batcher) resend(c *call, expired any) bool {
	if c.sends() >= maxSends {
		return false
	}
	if cd, ok := c.ctx.Deadline(); ok && time.Until(cd) < b.timeout {
		return false
	}
	if _, ok := c.markSend(); !ok {
		return false // answered (by the wait timer) or abandoned meanwhile
	}
	select {
	case b.queue <- c:
		b.resent.Add(1)
		return true
	default:
		// The queue is full: answered with the refusal (the timer of the
		// send that expired can no longer answer it).
		c.answer(expired, nil)
		return true
	}
}

// unanswered keeps, in place, the calls still to be sent: a call whose
// caller gave up, or that was answered meanwhile (by the wait timer), is
// not sent: nobody would read its answer, and it would consume. A call
// whose context ended is answered with its error.
func unanswered(calls []*call) []*call {
	live := calls[:0]
	for _, c := range calls {
		if c.status() != pending {
			continue
		}
		if err := c.ctx.Err(); err != nil {
			c.answer(nil, fmt.Errorf("redis: %w", err))
			continue
		}
		live = append(live, c)
	}
	return live
}

// scriptArgs returns the arguments of one FCALL carrying calls: their
// number, then each one's arguments.
func scriptArgs(calls []*call) []any {
	size := 1
	for _, c := range calls {
		size += c.req.ArgCount()
	}
	args := make([]any, 1, size)
	args[0] = len(calls)
	for _, c := range calls {
		args = c.req.AppendArgs(args)
	}
	return args
}

// markSent tells the callers of calls that asked (onSent) that the calls
// left, all at once in one pipeline.
func markSent(calls []*call, sent time.Time) {
	for _, c := range calls {
		if c.onSent != nil {
			c.onSent(sent, len(calls))
		}
	}
}

// setDeadlines stamps each call's request with its deadline and undo
// instant, in its node's clock.
func (b *batcher) setDeadlines(calls []*call, sent time.Time) {
	if b.clock == nil {
		return
	}
	for _, c := range calls {
		budget := b.budget(c, sent)
		rd, ok := b.clock.toRedis(c.node, sent.Add(budget))
		if !ok {
			continue // no reply of the node seen yet: its link's setup reads its clock, so only a new node
		}
		c.req.SetDeadline(rd, rd-undoSpan(budget).Microseconds())
	}
}

// notLoaded reports whether err says that a node does not have the library
// (a new or restarted node, FUNCTION FLUSH): nothing ran, the call may be
// sent again once the library is loaded.
func notLoaded(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// mayHaveRun reports whether a call that failed with err may have run: it
// was sent, and no reply says what happened (a timeout, a broken
// connection). An error reply from Redis means the function did not run
// (a moved slot, an unknown function, a refused argument); so does a
// link's refusal to dial (errNoDial: nothing was sent).
func mayHaveRun(err error) bool {
	return !IsRedisError(err) && !errors.Is(err, errNoDial)
}

// IsRedisError reports whether err is an error reply of Redis: the
// connection carried a whole reply and stays usable.
func IsRedisError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}
