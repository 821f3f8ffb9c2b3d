package redisstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
)

// The scripts and their wire contract. scripts/prelude.lua names every
// value below with the same name in upper snake case (ITEM_FIELDS for
// itemFields); TestWireContract fails when the two sides differ.

//go:embed scripts/prelude.lua
var preludeSource string

//go:embed scripts/decide.lua
var decideSource string

//go:embed scripts/release.lua
var releaseSource string

// library is the scripts as one Redis Functions library: loaded once per
// node (FUNCTION LOAD), then called with FCALL. Its top level, which defines
// every function of the scripts, runs once at load instead of at every call
// as with EVALSHA (that cost grew with the number of functions: 10 µs of
// Redis CPU per call for the per-algorithm sections). Its name and its
// functions' names carry a hash of the source, so that processes of
// different rls versions sharing a Redis each call their own.
type library struct {
	source  string // the argument of FUNCTION LOAD
	name    string
	decide  string // decide.lua's entry point: decides a batch of requests
	release string // release.lua's entry point: undoes a cluster reservation
}

var lib = newLibrary(preludeSource, decideSource, releaseSource)

func newLibrary(prelude, decide, release string) library {
	body := prelude + "\n" + decide + "\n" + release
	sum := sha256.Sum256([]byte(body))
	tag := hex.EncodeToString(sum[:6])
	lib := library{name: "rls_" + tag, decide: "rls_decide_" + tag, release: "rls_release_" + tag}
	// allow-cross-slot-keys: a request's keys on one cluster node may sit in
	// several slots (as EVAL scripts without flags may touch).
	register := func(name, entry string) string {
		return "redis.register_function{function_name='" + name + "', callback=" + entry + ", flags={'allow-cross-slot-keys'}}\n"
	}
	lib.source = "#!lua name=" + lib.name + "\n" + body + "\n" + register(lib.decide, "decide_entry") + register(lib.release, "release_entry")
	return lib
}

// load loads the library on Redis: on every master of a cluster. Loading
// it again is harmless (REPLACE, same source).
func (lib library) load(ctx context.Context, client redis.UniversalClient) error {
	err := eachNode(ctx, client, func(ctx context.Context, _ string, node *redis.Client) error {
		return node.FunctionLoadReplace(ctx, lib.source).Err()
	})
	if err != nil {
		return fmt.Errorf("redis: loading the rls function library: %w", err)
	}
	return nil
}

// notLoaded reports whether err says that a node does not have the library
// (a new or restarted node, FUNCTION FLUSH): nothing ran, the call may be
// sent again once the library is loaded.
func notLoaded(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// fcall calls a function of the library with keys and args, loading the
// library first when the node does not have it.
func (lib library) fcall(ctx context.Context, client redis.UniversalClient, fn string, keys []string, args ...any) *redis.Cmd {
	cmd := client.FCall(ctx, fn, keys, args...)
	if !notLoaded(cmd.Err()) {
		return cmd
	}
	if err := lib.load(ctx, client); err != nil {
		cmd.SetErr(err)
		return cmd
	}
	return client.FCall(ctx, fn, keys, args...)
}

// decide.lua's arguments (decide_entry): the number of requests, then per
// request requestHead fields at the request* positions and itemFields per
// item at the item* positions (from 1).
const (
	requestHead      = 5
	requestMode      = 1
	requestInstant   = 2
	requestDeadline  = 3
	requestUndoAfter = 4
	requestItems     = 5
	itemFields       = 8
	itemBase         = 1
	itemAlgorithm    = 2
	itemWindow       = 3
	itemLimit        = 4
	itemBurst        = 5
	itemHits         = 6
	itemFlags        = 7
	itemGroup        = 8 // 0, or a quota group; in modeReserve -g: group g is over elsewhere (regroup)
	flagRefund       = 1
	flagShadow       = 2
	flagCountDenied  = 4
	flagDenied       = 8
)

// logTotal is the member of a sliding log's sorted set whose score holds
// minus one minus the log's total hits.
const logTotal = "n"

// Modes of a request; see prelude.lua.
const (
	modeFinal     = "F"
	modeFinalMGET = "M"
	modeReserve   = "R"
	modeCharge    = "C"
	modePeek      = "P"
)

// decide.lua's reply per request: replyHead fields (verdict, instant), then
// unless expired replyItemFields per item; then the undo log (modeReserve
// when admitted; the other modes when decided after the undo instant) and,
// in modeReserve when admitted, the view.
const (
	replyHead       = 2
	replyItemFields = 4
	verdictDenied   = 0
	verdictAdmitted = 1
	verdictExpired  = 2
	// retryNever is an item's retry field when no wait admits its hits
	// (engine.Result.Never).
	retryNever = -1
	// An item's verdict field: admitted, denied, or denied with its hits
	// charged all the same (count-denied): then replyItemCharged minus what
	// remained just before the charge (engine.Result.RemainingBeforeCharge),
	// so that only those items pay for it, and with no field more.
	replyItemDenied   = 0
	replyItemAdmitted = 1
	replyItemCharged  = -1
)

// tbMaxAhead is the bound of a token bucket's TAT ahead of now, the
// engine's.
const tbMaxAhead = engine.MaxBucketAhead

// release.lua's operations.
const (
	undoWindow  = "W"
	undoTAT     = "T"
	undoZRem    = "Z"
	undoZAdd    = "A"
	undoPublish = "P"
)

// requestArgs returns the decide function's arguments for one request:
// its items' counters are bases[i], at instant now ("" for Redis TIME);
// at is the store's clock reading, around which calendar windows are
// computed. The deadline and undo instants are left empty for the batcher
// to fill in when it sends the request (setDeadline).
func requestArgs(mode, now string, at time.Time, items []engine.Item, bases []string) []any {
	args := make([]any, requestHead, requestHead+itemFields*len(items))
	args[requestMode-1] = mode
	args[requestInstant-1] = now
	args[requestDeadline-1] = ""
	args[requestUndoAfter-1] = ""
	args[requestItems-1] = len(items)
	for i := range items {
		it := &items[i]
		r := it.Rule
		flags := 0
		if it.Refund {
			flags |= flagRefund
		}
		if it.Shadow {
			flags |= flagShadow
		}
		if it.CountDenied {
			flags |= flagCountDenied
		}
		var f [itemFields]any
		f[itemBase-1] = bases[i]
		f[itemAlgorithm-1] = int(r.Code())
		f[itemWindow-1] = r.Window.Microseconds()
		if b, ok := r.CalendarBounds(at.UnixMicro()); ok {
			f[itemWindow-1] = fmt.Sprintf("%d:%d:%d:%d", b[0], b[1], b[2], b[3])
		}
		f[itemLimit-1] = r.Limit
		f[itemBurst-1] = r.Burst
		f[itemHits-1] = it.Hits
		f[itemFlags-1] = flags
		f[itemGroup-1] = it.Group
		args = append(args, f[:]...)
	}
	return args
}

// chargesDenied reports whether a request's arguments (of n items) ask for
// hits that count when denied: a denial of it consumes.
func chargesDenied(args []any, n int) bool {
	for k := range n {
		f := args[requestHead+k*itemFields:]
		flags, _ := f[itemFlags-1].(int)
		if hits, _ := f[itemHits-1].(uint64); flags&flagCountDenied != 0 && hits > 0 {
			return true
		}
	}
	return false
}

// setDeadline sets a request's deadline and undo instants (µs of Redis's
// clock; "" for none) in its arguments.
func setDeadline(args []any, deadline, undoAfter string) {
	args[requestDeadline-1] = deadline
	args[requestUndoAfter-1] = undoAfter
}

// errExpired is the error of a request that Redis refused to decide because
// its deadline had passed: nothing was consumed.
var errExpired = errors.New("redis: the request reached Redis after its deadline (not decided, nothing consumed)")

// reply is one request's reply, split: its verdict and instant, the rest.
type reply struct {
	verdict int64
	now     int64 // µs of the script's clock
	vals    []any
}

// parseReply splits the reply of one request, as the batch worker reads it.
func parseReply(r any) (reply, error) {
	vals, ok := r.([]any)
	if !ok || len(vals) < replyHead {
		return reply{}, fmt.Errorf("redis: unexpected decide reply %v", r)
	}
	verdict, _ := vals[0].(int64)
	now, _ := vals[1].(int64)
	return reply{verdict: verdict, now: now, vals: vals}, nil
}

// undo returns the reply's undo log, nil when it has none, for a request
// of n items.
func (r reply) undo(n int) []any {
	if r.verdict == verdictExpired || len(r.vals) <= replyHead+replyItemFields*n {
		return nil
	}
	undo, _ := r.vals[replyHead+replyItemFields*n].([]any)
	return undo
}

// readReply writes the results of the decide function's reply for one
// request and returns whether it was admitted; rest, when not nil, gets
// what follows the items (the undo log, the view).
func readReply(rep reply, items []engine.Item, results []engine.Result, rest *[]any) (bool, error) {
	if rep.verdict == verdictExpired {
		return false, errExpired
	}
	vals := rep.vals
	if len(vals) < replyHead+replyItemFields*len(items) {
		return false, fmt.Errorf("redis: unexpected decide reply %v", vals)
	}
	num := func(i int) int64 {
		n, _ := vals[i].(int64)
		return n
	}
	for i := range items {
		k := replyHead + replyItemFields*i
		results[i] = engine.Result{
			Remaining:  uint64(max(num(k+1), 0)),
			Reset:      time.Duration(num(k+2)) * time.Microsecond,
			RetryAfter: time.Duration(max(num(k+3), 0)) * time.Microsecond,
			Never:      num(k+3) == retryNever,
		}
		switch v := num(k); {
		case v == replyItemAdmitted:
			results[i].Admitted = true
		case v == replyItemDenied:
		case v <= replyItemCharged:
			results[i].RemainingBeforeCharge = uint64(replyItemCharged - v)
		default:
			return false, fmt.Errorf("redis: decide reply: item %d has the unknown verdict %d", i, v)
		}
	}
	if rest != nil {
		*rest = vals[replyHead+replyItemFields*len(items):]
	}
	return rep.verdict == verdictAdmitted, nil
}
