package redisconn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
)

// Slots that move. While a slot migrates (CLUSTER SETSLOT MIGRATING on its
// master, IMPORTING on the next, its keys moved by MIGRATE, then SETSLOT
// NODE), Redis checks a call's declared keys before it runs anything: the
// source runs it while it has them all, answers ASK (the target's address)
// when it has none, TRYAGAIN when it has some; the target runs a call sent
// right after ASKING, or answers TRYAGAIN when it lacks some of its several
// keys; once the slot is given away, the source answers MOVED. Inside a
// script, a key that the node does not serve stops the script with an
// error at the first command that touches it. Each of these error replies
// means that nothing was decided (the script stops, if at all, while it
// reads: it writes only after it has read every key, and what it may have
// written before, expired entries of a sliding log dropped, counts
// nothing), so a call that meets one is sent again, never one that may
// have run.
//
// A decision's FCALL declares every key that the decide function touches
// in the slot of its first item (request.route): the descriptor's hash,
// and the sorted sets of its sliding logs and concurrency limits. A call
// whose keys are all in that slot follows ASK and TRYAGAIN itself
// (sendSpan); a call of several slots, and any call told MOVED, fails with
// a redirectError, the slot map is read again, and the request is split
// anew, one part per slot (followSlots), each part then following its own
// slot.

// maxRedirects bounds the sends of one call that follows redirections
// (ASK, TRYAGAIN), and the rounds of a request split anew after a
// redirectError (followSlots); a caller's deadline bounds both too.
const maxRedirects = 5

// tryAgainPause is the first pause before a call answered TRYAGAIN is sent
// again (its keys are moving, one MIGRATE at a time); it doubles with each
// TRYAGAIN.
const tryAgainPause = time.Millisecond

// redirectError is the error of a call that a cluster node refused to run
// and that the request's parts split anew may get through (MOVED or
// CLUSTERDOWN, the slot map then read again; ASK for a call of several
// slots; a key the node does not serve, met by the script): nothing was
// decided.
type redirectError struct{ err error }

func (e *redirectError) Error() string {
	return fmt.Sprintf("%v (the cluster's slots are moving: nothing decided)", e.err)
}

func (e *redirectError) Unwrap() error { return e.err }

// isRedirect reports whether err is a redirectError.
func isRedirect(err error) bool {
	var r *redirectError
	return errors.As(err, &r)
}

// A redirection: what a node's error reply to a call says to do.
type redirection int

const (
	notRedirected    redirection = iota
	redirectAsk                  // ASK: the slot is migrating and the node has none of the keys
	redirectTryAgain             // TRYAGAIN: some of the keys moved, others not yet
	redirectMoved                // MOVED, CLUSTERDOWN, or a key the script met on a node that does not serve it: a stale slot map
)

// redirected returns what err, a node's reply to a call, says to do, and
// for ASK the address to ask.
func redirected(err error) (redirection, string) {
	if err == nil || !isRedisError(err) {
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

// applyCluster decides a request whose counters may sit on several masters.
// One master: the script decides it whole. Several: each master reserves
// its part (applyParts).
func (s *Store) applyCluster(ctx context.Context, items []engine.Item, bases []string, results []engine.Result) (bool, error) {
	return followSlots(ctx, func(bySlot bool) (bool, []*part, error) {
		parts, err := s.split(ctx, nil, items, bases, bySlot)
		if err != nil {
			return false, nil, err
		}
		if len(parts) == 1 {
			p := parts[0]
			var ok bool
			ok, p.err = s.applyNode(ctx, p.addr, modeFinal, items, bases, results, nil)
			return ok, parts, p.err
		}
		ok, err := applyParts(ctx, items, results, parts)
		return ok, parts, err
	})
}

// followSlots runs decide, which splits a request into parts by the slot
// map (one part per slot with bySlot, else one per node) and decides it,
// and runs it again, split by slot, while it fails only with
// redirectErrors: no part decided anything (a part that reserved has given
// its reservation back, see applyParts). At most maxRedirects rounds,
// within ctx.
func followSlots(ctx context.Context, decide func(bySlot bool) (bool, []*part, error)) (bool, error) {
	bySlot := false
	for round := 1; ; round++ {
		ok, parts, err := decide(bySlot)
		if err == nil || !isRedirect(err) || round == maxRedirects || ctx.Err() != nil {
			return ok, err
		}
		for _, p := range parts {
			if p.err != nil && !isRedirect(p.err) {
				return ok, err // that part may have run
			}
		}
		bySlot = true
	}
}

// split groups items (at positions idx of their request; nil: 0, 1, ...)
// into parts of s: one per master that owns their slots (per slot, with
// bySlot), or one for the store's one node.
func (s *Store) split(ctx context.Context, idx []int, items []engine.Item, bases []string, bySlot bool) ([]*part, error) {
	var parts []*part
	for i := range items {
		addr, slot := "", -1
		if s.cluster != nil {
			node, err := s.cluster.MasterForKey(ctx, bases[i])
			if err != nil {
				return nil, fmt.Errorf("redis cluster: slot of %q: %w", bases[i], err)
			}
			addr = node.Options().Addr
			if bySlot {
				slot = keySlot(bases[i])
			}
		}
		k := slices.IndexFunc(parts, func(p *part) bool { return p.addr == addr && p.slot == slot })
		if k < 0 {
			k = len(parts)
			parts = append(parts, &part{store: s, addr: addr, slot: slot})
		}
		p := parts[k]
		at := i
		if idx != nil {
			at = idx[i]
		}
		p.idx = append(p.idx, at)
		p.items = append(p.items, items[i])
		p.bases = append(p.bases, bases[i])
		p.results = append(p.results, engine.Result{})
	}
	return parts, nil
}

// reloadSlots reads the cluster's slot map again, and waits for it (within
// ctx).
func (s *Store) reloadSlots(ctx context.Context) {
	// ReloadState only schedules a reload; ForEachMaster waits for the new
	// slot map.
	s.cluster.ReloadState(ctx)
	s.cluster.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
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

// fcallRouted calls a function of the library with keys, on the node of
// keys[0], following the redirections of a slot that moves, which say that
// nothing ran: ASK (ASKING, then the call, on the node named), TRYAGAIN
// (again after a pause) and MOVED (again with a fresh slot map); at most
// maxRedirects times. It is for the calls that give hits back; decisions
// go through the batcher (sendSpan).
func (s *Store) fcallRouted(ctx context.Context, fn string, keys []string, args ...any) error {
	if s.cluster == nil {
		return lib.fcall(ctx, s.client, fn, keys, args...).Err()
	}
	ask, wait := "", tryAgainPause
	for tries := 1; ; tries++ {
		var err error
		if ask == "" {
			err = lib.fcall(ctx, s.client, fn, keys, args...).Err()
		} else {
			err = s.fcallAsking(ctx, ask, fn, keys, args...)
		}
		r, addr := redirected(err)
		if r == notRedirected || tries == maxRedirects || ctx.Err() != nil {
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
			s.reloadSlots(ctx)
		}
	}
}

// fcallAsking sends ASKING and then an FCALL to the node at addr, on a
// connection of its own (the node need not serve any slot yet).
func (s *Store) fcallAsking(ctx context.Context, addr, fn string, keys []string, args ...any) error {
	c := redis.NewClient(s.links.options(addr))
	defer c.Close()
	pipe := c.Pipeline()
	pipe.Do(ctx, "asking")
	cmd := pipe.FCall(ctx, fn, keys, args...)
	pipe.Exec(ctx) // errors are per command
	return cmd.Err()
}

// keySlot returns the Redis Cluster slot of key: the CRC16 (XMODEM) of its
// hash tag (the bytes between its first '{' and the next '}', when there
// are some) or else of the whole key, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[k]]
	}
	return int(crc) & 16383
}

// crc16Table is CRC16-XMODEM's (polynomial 0x1021) by byte.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
