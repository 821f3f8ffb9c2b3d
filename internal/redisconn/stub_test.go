package redisconn

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The driver's tests call a stub function library rather than the store's
// scripts: each request adds its hits to its key (INCRBY) unless it came
// past its deadline, so that a test reads in Redis exactly how many
// requests ran.
//
// A request's arguments: its key, its deadline and undo instant (µs of
// the node's clock; "" for none), its hits. Its reply: {1, now, the key's
// value after, 1 when run past its undo instant else 0}, or {2, now} when
// it came past its deadline (nothing done).
const stubLibrary = `#!lua name=rlsconn_stub
local function run(keys, args)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local out = {}
  local a = 2
  for r = 1, tonumber(args[1]) do
    local key, deadline, undo_after, hits = args[a], args[a + 1], args[a + 2], args[a + 3]
    a = a + 4
    if deadline ~= '' and now > tonumber(deadline) then
      out[r] = {2, now}
    else
      local undo = 0
      if undo_after ~= '' and now > tonumber(undo_after) then undo = 1 end
      out[r] = {1, now, redis.call('INCRBY', key, hits), undo}
    end
  end
  return out
end
local function give_back(keys, args)
  redis.call('DECRBY', keys[1], args[1])
end
redis.register_function{function_name='rlsconn_stub_run', callback=run, flags={'allow-cross-slot-keys'}}
redis.register_function{function_name='rlsconn_stub_give_back', callback=give_back}
`

const (
	stubRun      = "rlsconn_stub_run"
	stubGiveBack = "rlsconn_stub_give_back"
	stubRan      = 1
	stubExpired  = 2
)

// stubRequest is a request of the stub function: hits added to key.
type stubRequest struct {
	key                 string
	hits                int64
	deadline, undoAfter int64 // 0: none
}

func (r *stubRequest) ArgCount() int { return 4 }

func (r *stubRequest) AppendArgs(args []any) []any {
	deadline, undoAfter := any(""), any("")
	if r.deadline != 0 {
		deadline, undoAfter = r.deadline, r.undoAfter
	}
	return append(args, r.key, deadline, undoAfter, r.hits)
}

func (r *stubRequest) SetDeadline(deadline, undoAfter int64) {
	r.deadline, r.undoAfter = deadline, undoAfter
}

func (r *stubRequest) Head(v any) (int64, bool, error) {
	f, err := stubFields(v)
	if err != nil {
		return 0, false, err
	}
	return f[1], f[0] == stubExpired, nil
}

// stubFields returns the numbers of a stub reply.
func stubFields(v any) ([]int64, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) < 2 {
		return nil, fmt.Errorf("unexpected stub reply %v", v)
	}
	out := make([]int64, len(vals))
	for i, x := range vals {
		if out[i], ok = x.(int64); !ok {
			return nil, fmt.Errorf("unexpected stub reply %v", v)
		}
	}
	return out, nil
}

// outcomes counts what a Conn told its caller afterwards: late replies
// (those that ran, with their undo flag, and those that came expired) and
// indeterminate calls. Safe for concurrent use.
type outcomes struct {
	late, lateUndo, lateExpired, indeterminate atomic.Int64
	mu                                         sync.Mutex
	lates                                      []Late // guarded by mu
}

func (o *outcomes) onLate(l Late) {
	f, err := stubFields(l.Reply)
	switch {
	case err != nil:
		o.indeterminate.Add(1)
	case f[0] == stubExpired:
		o.lateExpired.Add(1)
	default:
		o.late.Add(1)
		if len(f) > 3 && f[3] == 1 {
			o.lateUndo.Add(1)
		}
	}
	o.mu.Lock()
	o.lates = append(o.lates, l)
	o.mu.Unlock()
}

func (o *outcomes) onIndeterminate(string, error) { o.indeterminate.Add(1) }

// testConn is a Conn with its outcomes.
type testConn struct {
	*Conn
	out *outcomes
}

// newConn returns a Conn on the stub library with opts (a generous
// timeout by default: -race and a busy machine), warmed as rls serve
// warms its store, closed when the test ends.
func newConn(t testing.TB, opts Options) *testConn {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	out := &outcomes{}
	opts.Library, opts.Function = stubLibrary, stubRun
	opts.OnLate, opts.OnIndeterminate = out.onLate, out.onIndeterminate
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c.Warm(ctx) // an error (Redis unreachable, a bad password) is left for the calls
	cancel()
	return &testConn{c, out}
}

// run asks c to add hits to key, and returns the key's value after, or
// errExpiredReply when Redis refused the request as past its deadline.
func (c *testConn) run(ctx context.Context, key string, hits int64) (int64, error) {
	node, err := c.NodeOf(ctx, key)
	if err != nil {
		return 0, err
	}
	v, err := c.Do(ctx, node, []string{key}, true, &stubRequest{key: key, hits: hits}, nil)
	if err != nil {
		return 0, err
	}
	f, err := stubFields(v)
	if err != nil {
		return 0, err
	}
	if f[0] == stubExpired {
		return 0, errExpiredReply
	}
	return f[2], nil
}

// bounded is run within the longest a call may take (as the store bounds a
// caller without a deadline).
func (c *testConn) bounded(key string, hits int64) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.MaxWait())
	defer cancel()
	return c.run(ctx, key, hits)
}

var errExpiredReply = errors.New("the request reached Redis past its deadline (nothing done)")

// count returns the value of key as Redis holds it (0 for none), read
// through c's own client, asked again for 10 s at most (a busy machine).
func (c *testConn) count(t testing.TB, key string) int64 {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var v string
		v, err = c.Client().Get(ctx, key).Result()
		cancel()
		if err == redis.Nil {
			return 0
		}
		if err == nil {
			n, perr := strconv.ParseInt(v, 10, 64)
			if perr != nil {
				t.Fatalf("GET %s = %q: %v", key, v, perr)
			}
			return n
		}
	}
	t.Fatalf("GET %s, asked for 10 s: %v", key, err)
	return 0
}

// settle waits for what happens after the callers have their answers: late
// replies read (a pipeline is waited for its bound at most).
func (c *testConn) settle() {
	time.Sleep(c.MaxWait())
}
