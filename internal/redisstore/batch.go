package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends the scripts of concurrent requests together: each of its
// workers takes every call queued at that moment (up to maxBatch) and sends
// them in one round trip, so that under load a round trip carries many
// decisions. With little load a call goes alone and waits for nobody.
//
// On a single node the calls of a round trip share FCALLs too: the decide
// function takes several requests (up to perScript) and decides them one
// after the other, so Redis pays a call's fixed cost once for all of them.
// In a cluster, where each call goes to the node of its keys, every call is
// an FCALL of its own in a pipeline.
type batcher struct {
	client    redis.UniversalClient
	queue     chan *call
	maxBatch  int
	perScript int
	timeout   time.Duration // bound of one pipeline

	scripts, roundTrips atomic.Uint64

	stop chan struct{}
	wg   sync.WaitGroup
}

type call struct {
	ctx  context.Context
	keys []string
	args []any // the request's arguments: mode, instant, items (see decide.lua)
	done chan struct{}
	// written by the worker before done is closed
	reply any
	err   error
}

func newBatcher(client redis.UniversalClient, maxBatch, perScript, workers int, timeout time.Duration) *batcher {
	b := &batcher{
		client:    client,
		queue:     make(chan *call, 16*maxBatch),
		maxBatch:  maxBatch,
		perScript: perScript,
		timeout:   timeout,
		stop:      make(chan struct{}),
	}
	for range workers {
		b.wg.Go(b.work)
	}
	return b
}

func (b *batcher) close() {
	close(b.stop)
	b.wg.Wait()
}

// errClosed is returned by calls on a closed store.
var errClosed = errors.New("redis store closed")

// do decides one request (keys, args) and returns the script's reply for it.
func (b *batcher) do(ctx context.Context, keys []string, args []any) (any, error) {
	c := &call{ctx: ctx, keys: keys, args: args, done: make(chan struct{})}
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
		// The worker may still send it; the Store contract allows that
		// (the caller cannot tell what was consumed).
		return nil, fmt.Errorf("redis: %w", ctx.Err())
	}
}

func (b *batcher) work() {
	batch := make([]*call, 0, b.maxBatch)
	for {
		select {
		case <-b.stop:
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
	fill:
		for len(batch) < b.maxBatch {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		b.send(batch)
		clear(batch)
	}
}

// send runs a batch in one pipeline of FCALLs, each deciding up to
// perScript calls; when a node does not have the function library (a
// restarted Redis, a new cluster node), nothing ran: the library is loaded
// and those FCALLs are sent again.
func (b *batcher) send(batch []*call) {
	// A call whose caller gave up while it waited is not sent: nobody would
	// read its answer, and it would consume.
	live := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = fmt.Errorf("redis: %w", err)
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	batch = live
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()

	type script struct {
		calls []*call
		args  []any
		cmd   *redis.Cmd
	}
	scripts := make([]script, 0, (len(batch)+b.perScript-1)/b.perScript)
	for len(batch) > 0 {
		calls := batch[:min(len(batch), b.perScript)]
		batch = batch[len(calls):]
		size := 1
		for _, c := range calls {
			size += len(c.args)
		}
		args := make([]any, 1, size)
		args[0] = len(calls)
		for _, c := range calls {
			args = append(args, c.args...)
		}
		scripts = append(scripts, script{calls: calls, args: args})
	}
	run := func(which []int) {
		pipe := b.client.Pipeline()
		for _, i := range which {
			sc := &scripts[i]
			sc.cmd = pipe.FCall(ctx, lib.decide, sc.calls[0].keys, sc.args...)
		}
		pipe.Exec(ctx) // errors are per command
		b.roundTrips.Add(1)
		b.scripts.Add(uint64(len(which)))
	}
	all := make([]int, len(scripts))
	for i := range all {
		all[i] = i
	}
	run(all)
	var again []int
	for i := range scripts {
		if notLoaded(scripts[i].cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		if err := lib.load(ctx, b.client); err != nil {
			for _, i := range again {
				scripts[i].cmd.SetErr(err)
			}
		} else {
			run(again)
		}
	}
	for i := range scripts {
		sc := &scripts[i]
		reply, err := sc.cmd.Result()
		replies, ok := reply.([]any)
		if err == nil && (!ok || len(replies) != len(sc.calls)) {
			err = fmt.Errorf("unexpected decide reply %v", reply)
		}
		for j, c := range sc.calls {
			if err != nil {
				c.err = fmt.Errorf("redis: %w", err)
			} else {
				c.reply = replies[j]
			}
			close(c.done)
		}
	}
}
