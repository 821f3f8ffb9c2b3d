package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends the scripts of concurrent requests together: each of its
// workers takes every call queued at that moment (up to maxBatch) and sends
// them as one pipeline, so that under load a round trip carries many
// decisions. With little load a call goes alone and waits for nobody.
type batcher struct {
	client   redis.UniversalClient
	script   *redis.Script
	queue    chan *call
	maxBatch int
	timeout  time.Duration // bound of one pipeline

	scripts, roundTrips atomic.Uint64

	stop chan struct{}
	wg   sync.WaitGroup
}

type call struct {
	ctx  context.Context
	keys []string
	args []any
	done chan struct{}
	// written by the worker before done is closed
	reply any
	err   error
}

func newBatcher(client redis.UniversalClient, script *redis.Script, maxBatch, workers int, timeout time.Duration) *batcher {
	b := &batcher{
		client:   client,
		script:   script,
		queue:    make(chan *call, 16*maxBatch),
		maxBatch: maxBatch,
		timeout:  timeout,
		stop:     make(chan struct{}),
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

// do runs the script with keys and args and returns its reply.
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

// send runs a batch as one pipeline of EVALSHA; scripts the server does
// not know yet (a restarted Redis, a new cluster node) are sent again with
// EVAL, which also loads them.
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
	cmds := make([]*redis.Cmd, len(batch))
	pipe := b.client.Pipeline()
	for i, c := range batch {
		cmds[i] = b.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	pipe.Exec(ctx) // errors are per command
	b.roundTrips.Add(1)
	b.scripts.Add(uint64(len(batch)))

	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		pipe := b.client.Pipeline()
		for _, i := range retry {
			cmds[i] = b.script.Eval(ctx, pipe, batch[i].keys, batch[i].args...)
		}
		pipe.Exec(ctx)
		b.roundTrips.Add(1)
		b.scripts.Add(uint64(len(retry)))
	}
	for i, c := range batch {
		c.reply, c.err = cmds[i].Result()
		if c.err != nil {
			c.err = fmt.Errorf("redis: %w", c.err)
		}
		close(c.done)
	}
}
