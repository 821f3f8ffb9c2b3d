package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/redisconn"
	"github.com/rlsproject/rls/internal/tracing/spans"
)

// The router. A request's counters may sit on several nodes: the masters
// of a cluster, and with a per-second Redis (persecond.go) that Redis's
// nodes beside the store's own. The router splits a request by backend
// (route), then by node (split): one node decides a request whole, in one
// FCALL; on several, each node reserves its part, concurrently, and when
// the request is denied anywhere every reservation is given back
// (applyParts, reserve.go). A cluster's slots that move have the request
// split anew, one part per slot (followSlots). The denial caches answer
// for the counters of their own backends: a request is answered from
// memory when each of its backends knows all of its share denied.

// routed is a request as the router sees it: its items, their counters,
// and its share on each backend (by the backend's position in the store:
// the store's own Redis, then the per-second one).
type routed struct {
	items  []engine.Item
	bases  []string
	shares [2]share
}

// share is the items of a request whose counters one backend holds.
type share struct {
	idx     []int // positions in the request; nil for all of them
	items   []engine.Item
	bases   []string
	results []engine.Result // fromCache's
	epoch   uint64          // the backend's denial cache's, when it was asked
}

// at returns the position in the request of the share's item j.
func (sh *share) at(j int) int {
	if sh.idx == nil {
		return j
	}
	return sh.idx[j]
}

// bounded returns ctx bounded, when its caller set no deadline, by the
// longest a request may take (queued, and its reply waited for).
func (s *Store) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.backends[0].conn.MaxWait())
}

// Apply implements engine.Store: the request is answered from the denial
// caches when they know it denied, else decided by the nodes that hold its
// counters (router.go).
func (s *Store) Apply(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if len(items) == 0 {
		return true, nil // nothing to ask Redis: admitted, as Evaluate reads it
	}
	sent := s.now()
	r := s.route(items)
	if s.fromCache(ctx, &r, results, sent) {
		return false, nil
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	admitted, err := s.decide(ctx, &r, results)
	if err != nil {
		s.errs.Add(1)
		if errors.Is(err, errExpired) {
			s.expired.Add(1)
		}
		return false, err
	}
	s.decisions.Add(1)
	s.remember(&r, results, admitted, sent)
	return admitted, nil
}

// Peek implements engine.Store: the decide function judges the request in
// its dry-run mode (modePeek) on every node that holds part of it (the
// masters of a cluster, the per-second Redis), concurrently; the rule over
// all the verdicts says whether Apply would admit it. The denial cache is
// neither read nor fed.
func (s *Store) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if len(items) == 0 {
		return true, nil
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	r := s.route(items)
	_, err := followSlots(ctx, func(bySlot bool) (bool, []*part, error) {
		parts, err := s.split(ctx, &r, bySlot)
		if err != nil {
			return false, nil, err
		}
		var wg sync.WaitGroup
		for _, p := range parts {
			wg.Go(func() {
				_, p.err = s.send(ctx, p.backend, p.addr, modePeek, p.items, p.bases, p.results, nil)
			})
		}
		wg.Wait()
		return false, parts, gather(parts, results)
	})
	if err != nil {
		return false, err
	}
	admitted, _ := engine.Admit(items, results)
	return admitted, nil
}

// send runs the decide function over items (all on node of b, "" for a
// single node) in mode and writes their results; out, when not nil, gets
// the whole reply (in modeReserve: the undo log and the view).
func (s *Store) send(ctx context.Context, b *backend, node, mode string, items []engine.Item, bases []string, results []engine.Result, out *reply) (bool, error) {
	return s.sendRequest(ctx, b, node, newRequest(mode, s.nowArg(), s.now(), items, bases), results, out)
}

// sendRequest runs the decide function on req (all on node of b) and
// writes its results; out, when not nil, gets the whole reply. A call that
// a recorded span led to makes a SpanRedis span of its trip, marked when
// its pipeline leaves (tracing.go).
func (s *Store) sendRequest(ctx context.Context, b *backend, node string, req *request, results []engine.Result, out *reply) (bool, error) {
	ctx, span := spans.Child(ctx, s.opts.Tracer, SpanRedis, trace.SpanKindClient)
	var onSent func(time.Time, int)
	if span.Recording() {
		span.Set(AttrDBSystem.String("redis"), AttrDBOperation.String("FCALL"), AttrMode.String(modeNames[req.mode]), AttrItems.Int(len(req.items)))
		if node != "" {
			span.Set(AttrServerAddress.String(node))
		}
		onSent = func(at time.Time, pipeline int) {
			span.Trace().AddEvent(EventSent, trace.WithTimestamp(at), trace.WithAttributes(AttrPipeline.Int(pipeline)))
		}
	}
	admitted, err := s.trip(ctx, b, node, req, results, out, onSent)
	span.End(err)
	return admitted, err
}

// trip is one request's trip to a node of b and back (redisconn.Conn.Do),
// onSent told when it leaves (nil: not).
func (s *Store) trip(ctx context.Context, b *backend, node string, req *request, results []engine.Result, out *reply, onSent func(time.Time, int)) (bool, error) {
	keys, oneSlot := req.route(b.conn.Cluster())
	raw, err := b.conn.Do(ctx, node, keys, oneSlot, req, onSent)
	if err != nil {
		return false, err
	}
	rep, err := parseReply(raw, len(req.items), req.holds)
	if err != nil {
		return false, err
	}
	if out != nil {
		*out = rep
	}
	return rep.results(req, results)
}

// A request as the driver carries it (redisconn.Request): the wire's
// arguments, its deadline stamped before each send, its reply's head.
var _ redisconn.Request = (*request)(nil)

func (r *request) ArgCount() int               { return r.argCount() }
func (r *request) AppendArgs(args []any) []any { return r.appendArgs(args) }

func (r *request) SetDeadline(deadline, undoAfter int64) {
	r.deadline, r.undoAfter = deadline, undoAfter
}

// Head reads the verdict and instant that start the request's reply
// (parseReply reads the rest).
func (r *request) Head(v any) (now int64, expired bool, err error) {
	vals, ok := v.([]any)
	if !ok || len(vals) < replyHead {
		return 0, false, fmt.Errorf("redis: unexpected decide reply %v", v)
	}
	verdict, _ := vals[0].(int64)
	now, _ = vals[1].(int64)
	return now, verdict == verdictExpired, nil
}

// route returns the request of items with each item's counter, shared
// between the backends: the counters of windows under a minute on the
// per-second Redis when there is one (perSecondLimit), the others on the
// store's own.
func (s *Store) route(items []engine.Item) routed {
	r := routed{items: items, bases: make([]string, len(items))}
	perSecond := 0
	for i := range items {
		r.bases[i] = s.base(&items[i])
		if len(s.backends) > 1 && perSecondLimit(items[i].Rule) {
			perSecond++
		}
	}
	switch perSecond {
	case 0:
		r.shares[0] = share{items: items, bases: r.bases}
	case len(items):
		r.shares[1] = share{items: items, bases: r.bases}
	default:
		for i := range items {
			sh := &r.shares[0]
			if perSecondLimit(items[i].Rule) {
				sh = &r.shares[1]
			}
			sh.idx, sh.items, sh.bases = append(sh.idx, i), append(sh.items, items[i]), append(sh.bases, r.bases[i])
		}
	}
	return r
}

// fromCache answers the request from the denial caches when each backend's
// knows every item of its share to be denied: then each status is exactly
// what Redis would answer. A request counts once among the caches'
// lookups, whichever holds its counters (as the reference's one local
// cache serves both its Redis).
func (s *Store) fromCache(ctx context.Context, r *routed, results []engine.Result, now time.Time) bool {
	if !s.opts.DenyCache {
		return false
	}
	answered := true
	for k, b := range s.backends {
		sh := &r.shares[k]
		if len(sh.items) == 0 {
			continue
		}
		sh.results = results
		if sh.idx != nil {
			sh.results = make([]engine.Result, len(sh.items))
		}
		var denied bool
		denied, sh.epoch = b.cache.deny(sh.items, sh.bases, sh.results, now)
		answered = answered && denied
	}
	s.backends[0].cache.counted(answered)
	if !answered {
		return false
	}
	for k := range s.backends {
		if sh := &r.shares[k]; sh.idx != nil {
			for j, i := range sh.idx {
				results[i] = sh.results[j]
			}
		}
	}
	s.cacheHits.Add(1)
	s.cacheHit(ctx)
	return true
}

// remember has each backend's denial cache learn from the statuses of its
// share of a request that Redis decided (sent: when it left).
func (s *Store) remember(r *routed, results []engine.Result, admitted bool, sent time.Time) {
	if !s.opts.DenyCache {
		return
	}
	for k, b := range s.backends {
		sh := &r.shares[k]
		if len(sh.items) == 0 {
			continue
		}
		if sh.idx != nil {
			for j, i := range sh.idx {
				sh.results[j] = results[i]
			}
		}
		b.cache.remember(sh.items, sh.bases, sh.results, admitted, sent, sh.epoch)
	}
}

// decide has the nodes that hold the request's counters decide it: one
// node whole, several each reserving its part (applyParts).
func (s *Store) decide(ctx context.Context, r *routed, results []engine.Result) (bool, error) {
	for k, b := range s.backends {
		if len(r.shares[k].items) == len(r.items) && !b.conn.Cluster() {
			return s.send(ctx, b, "", modeFinal, r.items, r.bases, results, nil) // one node: no split
		}
	}
	return followSlots(ctx, func(bySlot bool) (bool, []*part, error) {
		parts, err := s.split(ctx, r, bySlot)
		if err != nil {
			return false, nil, err
		}
		if len(parts) == 1 {
			p := parts[0]
			var ok bool
			ok, p.err = s.send(ctx, p.backend, p.addr, modeFinal, r.items, r.bases, results, nil)
			return ok, parts, p.err
		}
		ok, err := s.applyParts(ctx, r.items, results, parts)
		return ok, parts, err
	})
}

// followSlots runs decide, which splits a request into parts by the slot
// map (one part per slot with bySlot, else one per node) and decides it,
// and runs it again, split by slot, while it fails only with redirections
// (redisconn.IsRedirect): no part decided anything (a part that reserved
// has given its reservation back, see applyParts). At most
// redisconn.MaxRedirects rounds, within ctx.
func followSlots(ctx context.Context, decide func(bySlot bool) (bool, []*part, error)) (bool, error) {
	bySlot := false
	for round := 1; ; round++ {
		ok, parts, err := decide(bySlot)
		if err == nil || !redisconn.IsRedirect(err) || round == redisconn.MaxRedirects || ctx.Err() != nil {
			return ok, err
		}
		for _, p := range parts {
			if p.err != nil && !redisconn.IsRedirect(p.err) {
				return ok, err // that part may have run
			}
		}
		bySlot = true
	}
}

// split groups the items of r into parts: one per backend and node that
// owns their slots (per slot, with bySlot), or one for a backend's one
// node.
func (s *Store) split(ctx context.Context, r *routed, bySlot bool) ([]*part, error) {
	var parts []*part
	for k, b := range s.backends {
		sh := &r.shares[k]
		for j := range sh.items {
			addr, err := b.conn.NodeOf(ctx, sh.bases[j])
			if err != nil {
				return nil, err
			}
			slot := -1
			if bySlot && b.conn.Cluster() {
				slot = keySlot(sh.bases[j])
			}
			n := slices.IndexFunc(parts, func(p *part) bool { return p.backend == b && p.addr == addr && p.slot == slot })
			if n < 0 {
				n = len(parts)
				parts = append(parts, &part{backend: b, addr: addr, slot: slot})
			}
			p := parts[n]
			p.idx = append(p.idx, sh.at(j))
			p.items = append(p.items, sh.items[j])
			p.bases = append(p.bases, sh.bases[j])
			p.results = append(p.results, engine.Result{})
		}
	}
	return parts, nil
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
