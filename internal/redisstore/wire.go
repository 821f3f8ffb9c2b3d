package redisstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/descriptors"
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
	var err error
	if c, ok := client.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return node.FunctionLoadReplace(ctx, lib.source).Err()
		})
	} else {
		err = client.FunctionLoadReplace(ctx, lib.source).Err()
	}
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

// Algorithm codes: descriptors.Algorithm.
const (
	algFixedWindow   = int(descriptors.FixedWindow)
	algSlidingWindow = int(descriptors.SlidingWindow)
	algSlidingLog    = int(descriptors.SlidingLog)
	algTokenBucket   = int(descriptors.TokenBucket)
)

// decide.lua's arguments (decide_entry): the number of requests, then per request
// requestHead fields (mode, instant, item count) and itemFields per item, at
// the item* positions (from 1).
const (
	requestHead   = 3
	itemFields    = 8
	itemBase      = 1
	itemAlgorithm = 2
	itemWindow    = 3
	itemLimit     = 4
	itemBurst     = 5
	itemHits      = 6
	itemFlags     = 7
	itemGroup     = 8
	flagRefund    = 1
	flagShadow    = 2
)

// Modes of a request; see prelude.lua.
const (
	modeFinal     = "F"
	modeFinalMGET = "M"
	modeReserve   = "R"
)

// decide.lua's reply per request: replyHead fields, then replyItemFields per
// item; in modeReserve when admitted, the undo log and the view after them.
const (
	replyHead       = 2
	replyItemFields = 4
)

// release.lua's operations.
const (
	undoIncrBy  = "I"
	undoTAT     = "T"
	undoZRem    = "Z"
	undoZAdd    = "A"
	undoPublish = "P"
)

// requestArgs returns the decide script's arguments for one request: its
// items' counters are bases[i], at instant now ("" for Redis TIME).
func requestArgs(mode, now string, items []engine.Item, bases []string) []any {
	args := make([]any, 0, requestHead+itemFields*len(items))
	args = append(args, mode, now, len(items))
	for i := range items {
		it := &items[i]
		l := it.Limit
		flags := 0
		if it.Refund {
			flags |= flagRefund
		}
		if it.Shadow {
			flags |= flagShadow
		}
		var f [itemFields]any
		f[itemBase-1] = bases[i]
		f[itemAlgorithm-1] = int(l.Algorithm)
		f[itemWindow-1] = l.Window.Microseconds()
		f[itemLimit-1] = l.RequestsPerUnit
		f[itemBurst-1] = l.Burst
		f[itemHits-1] = it.Hits
		f[itemFlags-1] = flags
		f[itemGroup-1] = it.Group
		args = append(args, f[:]...)
	}
	return args
}

// readReply writes the results of the decide script's reply for one
// request and returns whether it was admitted; rest, when not nil, gets
// what follows the items (modeReserve: the undo log and the view).
func readReply(reply any, items []engine.Item, results []engine.Result, rest *[]any) (bool, error) {
	vals, ok := reply.([]any)
	if !ok || len(vals) < replyHead+replyItemFields*len(items) {
		return false, fmt.Errorf("redis: unexpected decide reply %v", reply)
	}
	num := func(i int) int64 {
		n, _ := vals[i].(int64)
		return n
	}
	for i := range items {
		k := replyHead + replyItemFields*i
		results[i] = engine.Result{
			Admitted:   num(k) == 1,
			Remaining:  uint64(max(num(k+1), 0)),
			Reset:      time.Duration(num(k+2)) * time.Microsecond,
			RetryAfter: time.Duration(num(k+3)) * time.Microsecond,
		}
	}
	if rest != nil {
		*rest = vals[replyHead+replyItemFields*len(items):]
	}
	return num(0) == 1, nil
}
