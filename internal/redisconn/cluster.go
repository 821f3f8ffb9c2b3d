package redisconn

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Slots that move. While a slot migrates (CLUSTER SETSLOT MIGRATING on its
// master, IMPORTING on the next, its keys moved by MIGRATE, then SETSLOT
// NODE), Redis checks a call's declared keys before it runs anything: the
// source runs it while it has them all, answers ASK (the target's address)
// when it has none, TRYAGAIN when it has some; the target runs a call sent
// right after ASKING, or answers TRYAGAIN when it lacks some of its several
// keys; once the slot is given away, the source answers MOVED. Inside a
// function, a key that the node does not serve stops it with an error at
// the first command that touches it. Each of these error replies means
// that nothing was done (the caller's function must write only after it
// has read every key, as rls's do), so a call that meets one is sent
// again, never one that may have run.
//
// A call whose keys are all the keys it touches, in one slot, follows ASK
// and TRYAGAIN itself (Do's oneSlot); a call of several slots told ASK, and
// any call told MOVED, fails with a redirectError (IsRedirect), after the
// slot map is read again, for its caller to split its request anew, one
// part per slot, each part then following its own slot.

// MaxRedirects bounds the sends of one call that follows redirections
// (ASK, TRYAGAIN), and is the bound its callers put on the rounds of a
// request split anew after a redirectError; a caller's deadline bounds both
// too.
const MaxRedirects = 5

// tryAgainPause is the first pause before a call answered TRYAGAIN is sent
// again (its keys are moving, one MIGRATE at a time); it doubles with each
// TRYAGAIN.
const tryAgainPause = time.Millisecond

// redirectError is the error of a call that a cluster node refused to run
// and that the request's parts split anew may get through (MOVED or
// CLUSTERDOWN, the slot map then read again; ASK for a call of several
// slots; a key the node does not serve, met by the function): nothing was
// done.
type redirectError struct{ err error }

func (e *redirectError) Error() string {
	return fmt.Sprintf("%v (the cluster's slots are moving: nothing decided)", e.err)
}

func (e *redirectError) Unwrap() error { return e.err }

// IsRedirect reports whether err is the error of a call that a cluster
// node refused to run and that the request split anew may get through
// (see Do): nothing was done.
func IsRedirect(err error) bool {
	var r *redirectError
	return errors.As(err, &r)
}

// A redirection: what a node's error reply to a call says to do.
type redirection int

const (
	notRedirected    redirection = iota
	redirectAsk                  // ASK: the slot is migrating and the node has none of the keys
	redirectTryAgain             // TRYAGAIN: some of the keys moved, others not yet
	redirectMoved                // MOVED, CLUSTERDOWN, or a key the function met on a node that does not serve it: a stale slot map
)

// redirected returns what err, a node's reply to a call, says to do, and
// for ASK the address to ask.
func redirected(err error) (redirection, string) {
	if err == nil || !IsRedisError(err) {
		return notRedirected, ""
	}
	if addr, ok := redis.IsAskError(err); ok {
		return redirectAsk, addr
	}
	if redis.IsTryAgainError(err) {
		return redirectTryAgain, ""
	}
	if _, ok := redis.IsMovedError(err); ok || redis.IsClusterDownError(err) {
		return redirectMoved, ""
	}
	// Errors of a script at a command that the node refused (Redis 7.0
	// says "non local key" for all of them; later versions tell TRYAGAIN
	// apart as "during rehashing", and "slot not served").
	msg := err.Error()
	for _, s := range []string{"Script attempted to access a non local key", "during rehashing of the slot", "Script attempted to access a slot not served",
		"Script attempted to execute a command while the cluster is down"} {
		if strings.Contains(msg, s) {
			return redirectMoved, ""
		}
	}
	return notRedirected, ""
}

// reloadSlots reads the cluster's slot map again, and waits for it (within
// ctx).
func (c *Conn) reloadSlots(ctx context.Context) {
	// ReloadState only schedules a reload; ForEachMaster waits for the new
	// slot map.
	c.cluster.ReloadState(ctx)
	c.cluster.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Call calls the library's function fn with keys and args on the node of
// keys[0], on its own (not batched), and ignores its reply. A node without
// the library has it loaded, and the call is sent again; so is a call that
// a slot that moves redirects, which says that nothing ran: ASK (ASKING,
// then the call, on the node named), TRYAGAIN (again after a pause) and
// MOVED (again with a fresh slot map); at most MaxRedirects times. It is
// for calls whose outcome its caller takes care of (giving hits back).
func (c *Conn) Call(ctx context.Context, fn string, keys []string, args ...any) error {
	ask, wait := "", tryAgainPause
	for tries := 1; ; tries++ {
		var err error
		if ask == "" {
			err = c.fcall(ctx, fn, keys, args...)
		} else {
			err = c.fcallAsking(ctx, ask, fn, keys, args...)
		}
		if err == redis.Nil {
			return nil // a function that returns nothing
		}
		r, addr := redirected(err)
		if r == notRedirected || c.cluster == nil || tries == MaxRedirects || ctx.Err() != nil {
			return err
		}
		ask = ""
		switch r {
		case redirectAsk:
			ask = addr
		case redirectTryAgain:
			pause(ctx, wait)
			wait *= 2
		default:
			c.reloadSlots(ctx)
		}
	}
}

// fcall calls fn with keys and args through the client, loading the
// library first when the node does not have it.
func (c *Conn) fcall(ctx context.Context, fn string, keys []string, args ...any) error {
	err := c.client.FCall(ctx, fn, keys, args...).Err()
	if !notLoaded(err) {
		return err
	}
	if err := c.load(ctx); err != nil {
		return err
	}
	return c.client.FCall(ctx, fn, keys, args...).Err()
}

// load loads the library on Redis: on every master of a cluster. Loading
// it again is harmless (REPLACE, same source).
func (c *Conn) load(ctx context.Context) error {
	err := eachNode(ctx, c.client, func(ctx context.Context, _ string, node *redis.Client) error {
		return node.FunctionLoadReplace(ctx, c.opts.Library).Err()
	})
	if err != nil {
		return fmt.Errorf("redis: loading the function library: %w", err)
	}
	return nil
}

// fcallAsking sends ASKING and then an FCALL to the node at addr, on a
// connection of its own (the node need not serve any slot yet).
func (c *Conn) fcallAsking(ctx context.Context, addr, fn string, keys []string, args ...any) error {
	cl := redis.NewClient(c.links.options(addr))
	defer cl.Close()
	pipe := cl.Pipeline()
	pipe.Do(ctx, "asking")
	cmd := pipe.FCall(ctx, fn, keys, args...)
	pipe.Exec(ctx) // errors are per command
	return cmd.Err()
}
