package redisstore

import (
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// The scripts and their wire contract. scripts/prelude.lua names every
// value below with the same name in upper snake case (ITEM_FIELDS for
// itemFields); TestWireContract fails when the two sides differ.

//go:embed scripts
var scripts embed.FS

// The library's files, in the order they are assembled (see prelude.lua):
// libraryHead, then each algorithm's file (algorithmScript) by code, then
// libraryTail. A file sees the locals of those before it.
var (
	libraryHead = []string{"prelude.lua", "decide/state.lua", "decide/hashes.lua"}
	libraryTail = []string{"penalty.lua", "decide/reserve.lua", "decide/parse.lua", "decide/load.lua", "decide/judge.lua", "decide/lean.lua",
		"decide/charge.lua", "decide/reply.lua", "decide/decide.lua", "release.lua"}
)

// algorithmScript is the file of the engine's algorithm name under
// scripts: it registers the algorithm under its code (ALG_<NAME>).
func algorithmScript(name string) string { return "alg/" + name + ".lua" }

// libraryFiles returns the paths of the library's files in order.
func libraryFiles() []string {
	files := slices.Clone(libraryHead)
	for _, name := range engine.Algorithms() {
		files = append(files, algorithmScript(name))
	}
	return append(files, libraryTail...)
}

// script returns the text of the file at path under scripts; a missing
// file is a programmer's error (an algorithm without its script).
func script(path string) string {
	b, err := scripts.ReadFile("scripts/" + path)
	if err != nil {
		panic(fmt.Sprintf("redisstore: the Redis scripts have no %s: %v", path, err))
	}
	return string(b)
}

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
	decide  string // decide/decide.lua's entry point: decides a batch of requests
	release string // release.lua's entry point: undoes a cluster reservation
}

var lib = newLibrary(libraryFiles())

// newLibrary assembles the files at paths (under scripts), each after a
// comment line that names it: Redis reports a line of the whole.
func newLibrary(paths []string) library {
	var body strings.Builder
	for _, p := range paths {
		body.WriteString("-- scripts/" + p + "\n")
		body.WriteString(script(p))
		body.WriteString("\n")
	}
	sum := sha256.Sum256([]byte(body.String()))
	tag := hex.EncodeToString(sum[:6])
	lib := library{name: "rls_" + tag, decide: "rls_decide_" + tag, release: "rls_release_" + tag}
	// allow-cross-slot-keys: a request's keys on one cluster node may sit in
	// several slots (as EVAL scripts without flags may touch).
	register := func(name, entry string) string {
		return "redis.register_function{function_name='" + name + "', callback=" + entry + ", flags={'allow-cross-slot-keys'}}\n"
	}
	lib.source = "#!lua name=" + lib.name + "\n" + body.String() + register(lib.decide, "decide_entry") + register(lib.release, "release_entry")
	return lib
}

// The decide function's arguments (decide_entry): the number of requests, then per
// request requestHead fields at the request* positions and itemFields per
// item at the item* positions (from 1); a request whose items all take
// one hit with no flags and no group sends minus the number of its items
// and plainItemFields per item (the key and the rule); one with
// reservation calls sends reservingItems and the number of its items, and
// reservingItemFields per item (itemFields and the reservation's id).
const (
	requestHead     = 4
	requestMode     = 1
	requestInstant  = 2
	requestDeadline = 3 // "" or the deadline and the undo instant as deadlinePack
	requestItems    = 4
	// deadlinePack is how requestDeadline packs its two instants: little-
	// endian float64s (exact below 2^53), which the function reads with one
	// call instead of two decimal conversions.
	deadlinePack   = "<dd"
	reservingItems = "r"
	itemFields     = 4
	// reservingItemFields: itemFields and itemReservation, the id ("" for
	// none).
	reservingItemFields = 5
	itemReservation     = 5
	plainItemFields     = 2
	itemKey             = 1 // the descriptor's key: the hash of its counters; sameKey for the previous item's
	sameKey             = ""
	itemRule            = 2 // ruleArg: code|window|limit|burst|penalty|reserve|id
	itemHits            = 3
	itemOpts            = 4 // flags + optsGroup × group
	optsGroup           = 16
	flagRefund          = 1
	flagShadow          = 2
	flagCountDenied     = 4
	flagDenied          = 8
	// rulePattern is the Lua pattern that reads an item's rule argument.
	rulePattern = `^(%d+)|([%d:]+)|(%d+)|(%d+)|([%d:]*)|([%d:]*)|(.*)$`
)

// stateNumber is how the scripts pack each number of a counter's state in
// its hash field (engine.DescriptorKey): a little-endian float64, exact
// below 2^53.
const stateNumber = "<d"

// logTotal is the member of a sliding log's sorted set whose score holds
// minus one minus the log's total hits.
const logTotal = "n"

// Modes of a request; see prelude.lua.
const (
	modeFinal   = "F"
	modeReserve = "R"
	modeCharge  = "C"
	modePeek    = "P"
)

// The decide function's reply per request: replyHead fields (verdict, instant), then
// unless expired replyItemFields per item; then the undo log (modeReserve
// when admitted; the other modes when decided after the undo instant) and,
// in modeReserve when admitted, the view.
const (
	replyHead       = 2
	replyItemFields = 4
	verdictDenied   = 0
	verdictAdmitted = 1
	verdictExpired  = 2
	// verdictAdmittedStates: admitted, and per item its counter's field as
	// the decision left it instead of its status (see prelude.lua):
	// parseReply reads it as verdictAdmitted with states.
	verdictAdmittedStates = 3
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
	// replyItemBlocked: denied by its counter's penalty block
	// (engine.Result.Blocked); replyItemBlockedCharged: and charged.
	replyItemBlocked        = 2
	replyItemBlockedCharged = 3
	// replyHoldFields more per item whose rule reserves: its phase
	// (engine.Phase), the hits it held or released, its counter's hits
	// held and holds, the age in µs of the oldest hold (modePeek), and the
	// holds that ended by themselves and their hits.
	replyHoldFields     = 7
	phaseNone           = int(engine.NotReserving)
	phaseReserving      = int(engine.Reserving)
	phaseSettling       = int(engine.Settling)
	phaseSettledAgain   = int(engine.SettledAgain)
	phaseSettlingUnheld = int(engine.SettlingUnheld)
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
	undoHold    = "H"
)

// request is one request as the decide function reads it: the request* fields, then
// the item* fields of each item (see prelude.lua). The batcher stamps its
// deadline and undo instant when it sends it (stamp).
type request struct {
	mode string
	// instant is the test clock's reading in µs (Options.Now: the scripts'
	// test seam, see prelude.lua), "" for Redis TIME.
	instant string
	// deadline is the instant of the node's clock (µs) past which it is not
	// decided, undoAfter the one past which a decision carries its undo log;
	// 0 for none (sent as "").
	deadline, undoAfter int64
	items               []wireItem
	// reserving: some item is a reservation call (engine.Item.Reserving):
	// the items carry their ids (reservingItemFields). holds[i] says
	// whether item i's rule reserves (its reply has replyHoldFields more);
	// nil when none does.
	reserving bool
	holds     []bool
}

// wireItem is one limit of a request as the decide function reads it.
type wireItem struct {
	base string // the counter's key (engine.CounterKey): the key of the hash, ':' and the field
	// key is the hash (the descriptor's key, a prefix of base) and rule the
	// ruleArg, both boxed once for the arguments: items of a descriptor
	// share their key's, requests of a rule its rule's.
	key, rule any
	// limit is the item's rule, for the statuses of a reply that carries
	// the states (verdictAdmittedStates).
	limit *engine.Rule
	hits  uint64
	// flags is the sum of the flag* values; group is 0 or a quota group
	// (in modeReserve -g: group g is over elsewhere, see regroup).
	flags int
	group int32
	// reservation is the item's reservation id ("" for none).
	reservation string
}

// opts is the item's itemOpts argument.
func (w *wireItem) opts() int64 { return int64(w.flags) + optsGroup*int64(w.group) }

// ruleArgs caches the itemRule argument of each rule whose window does not
// move (all but calendar windows), boxed: rules are immutable and shared by
// every request of a config. Emptied when it holds maxRuleArgs (the rules
// of configs since replaced stay until then).
var (
	ruleArgs    sync.Map // *engine.Rule → any (a string)
	nRuleArgs   atomic.Int64
	maxRuleArgs = int64(1 << 16)
)

// ruleArg returns the itemRule argument of rule r (rulePattern), boxed:
// its algorithm code, window in µs (for a calendar window "b1:b2:b3:b4",
// engine.Rule.CalendarBounds around at), limit, burst, penalty
// (engine.Rule.PenaltyArg) and ID.
func ruleArg(r *engine.Rule, at time.Time) any {
	if b, ok := r.CalendarBounds(at.UnixMicro()); ok {
		return fmt.Sprintf("%d|%d:%d:%d:%d|%d|%d|%s|%s|%s", r.Code(), b[0], b[1], b[2], b[3], r.Limit, r.Burst, r.PenaltyArg(), r.ReserveArg(), r.ID)
	}
	if v, ok := ruleArgs.Load(r); ok {
		return v
	}
	var arg any = fmt.Sprintf("%d|%d|%d|%d|%s|%s|%s", r.Code(), r.Window.Microseconds(), r.Limit, r.Burst, r.PenaltyArg(), r.ReserveArg(), r.ID)
	if nRuleArgs.Add(1) > maxRuleArgs {
		ruleArgs.Clear()
		nRuleArgs.Store(1)
	}
	ruleArgs.Store(r, arg)
	return arg
}

// modeArgs are the modes, boxed once for the arguments.
var modeArgs = map[string]any{modeFinal: modeFinal, modeReserve: modeReserve, modeCharge: modeCharge, modePeek: modePeek}

// newRequest returns the request of items, whose counters are bases[i],
// in mode, at instant ("" for Redis TIME); at is the store's clock
// reading, around which calendar windows are given.
func newRequest(mode, instant string, at time.Time, items []engine.Item, bases []string) *request {
	r := &request{mode: mode, instant: instant, items: make([]wireItem, len(items))}
	var prevKey string
	var prevArg any
	for i := range items {
		it, rule := &items[i], items[i].Rule
		w := &r.items[i]
		base := bases[i]
		if key := base[:len(base)-len(rule.ID)-1]; i == 0 || key != prevKey {
			prevKey, prevArg = key, key // boxed once per descriptor
		}
		*w = wireItem{base: base, key: prevArg, rule: ruleArg(rule, at), limit: rule, hits: it.Hits, group: it.Group}
		if it.Refund {
			w.flags |= flagRefund
		}
		if it.Shadow {
			w.flags |= flagShadow
		}
		if it.CountDenied {
			w.flags |= flagCountDenied
		}
		if rule.Reserve != nil {
			if r.holds == nil {
				r.holds = make([]bool, len(items))
			}
			r.holds[i] = true
			if it.Reserving() {
				w.reservation, r.reserving = it.Reservation, true
			}
		}
	}
	return r
}

// plain reports whether every item takes one hit, with no flags and no
// group, and none is a reservation call: the items are sent as
// plainItemFields each.
func (r *request) plain() bool {
	if r.reserving {
		return false
	}
	for i := range r.items {
		if w := &r.items[i]; w.hits != 1 || w.opts() != 0 {
			return false
		}
	}
	return true
}

// appendArgs appends the request's arguments to dst.
func (r *request) appendArgs(dst []any) []any {
	plain := r.plain()
	var head [requestHead]any
	head[requestMode-1] = modeArgs[r.mode]
	head[requestInstant-1] = r.instant
	head[requestDeadline-1] = ""
	if r.deadline != 0 {
		head[requestDeadline-1] = packDeadline(r.deadline, r.undoAfter)
	}
	head[requestItems-1] = len(r.items)
	switch {
	case plain:
		head[requestItems-1] = -len(r.items)
	case r.reserving:
		head[requestItems-1] = reservingItems + strconv.Itoa(len(r.items))
	}
	dst = append(dst, head[:]...)
	for i := range r.items {
		w := &r.items[i]
		var f [itemFields]any
		f[itemKey-1] = w.key
		if i > 0 && w.key == r.items[i-1].key {
			f[itemKey-1] = sameKey // Redis reads, and Lua interns, a long key once
		}
		f[itemRule-1] = w.rule
		if plain {
			dst = append(dst, f[:plainItemFields]...)
			continue
		}
		f[itemHits-1] = w.hits
		f[itemOpts-1] = w.opts()
		dst = append(dst, f[:]...)
		if r.reserving {
			dst = append(dst, w.reservation)
		}
	}
	return dst
}

// packDeadline returns the requestDeadline argument of the instants
// deadline and undoAfter (deadlinePack).
func packDeadline(deadline, undoAfter int64) string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], math.Float64bits(float64(deadline)))
	binary.LittleEndian.PutUint64(b[8:], math.Float64bits(float64(undoAfter)))
	return string(b[:])
}

// argCount is the number of arguments the request takes.
func (r *request) argCount() int {
	switch {
	case r.plain():
		return requestHead + plainItemFields*len(r.items)
	case r.reserving:
		return requestHead + reservingItemFields*len(r.items)
	}
	return requestHead + itemFields*len(r.items)
}

// chargesDenied reports whether the request asks for hits that count when
// denied: a denial of it consumes.
func (r *request) chargesDenied() bool {
	for i := range r.items {
		if w := &r.items[i]; w.flags&flagCountDenied != 0 && w.hits > 0 {
			return true
		}
	}
	return false
}

// bases returns the counters of the request's items.
func (r *request) bases() []string {
	bases := make([]string, len(r.items))
	for i := range r.items {
		bases[i] = r.items[i].base
	}
	return bases
}

// route returns the keys of the request's FCALL, and whether they are all
// the keys it touches. Off a cluster one key, its first counter's: slots
// mean nothing there. In a cluster, every key that the decide function touches
// in the slot of the first (touched), each once: they route the call, and
// a node that migrates or imports that slot checks them all before
// anything runs (see cluster.go), so that a call runs only where its keys
// are. oneSlot reports whether the request touches no other slot.
func (r *request) route(cluster bool) (keys []string, oneSlot bool) {
	if !cluster {
		return []string{r.items[0].base}, true
	}
	slot := -1
	oneSlot = true
	for i := range r.items {
		for _, k := range r.items[i].touched() {
			if k == "" {
				continue
			}
			ks := keySlot(k)
			if slot < 0 {
				slot = ks
			}
			if ks != slot {
				oneSlot = false
			} else if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	return keys, oneSlot
}

// touched returns the keys that the decide function reads and writes for
// the item (the package doc's key layout): its descriptor's hash for a
// counter kept there (and a penalty's or reservations' field), its
// counter's own key (a sorted set) for one kept there
// (engine.Rule.OwnKey), and the keys of its reservations when its rule
// reserves; "" for none. TestRouteKeysAreTheKeysTouched holds it to what
// the function touches.
func (w *wireItem) touched() [4]string {
	var t [4]string
	if w.limit.OwnKey() {
		t[1] = w.base
		if w.limit.Penalized() || w.limit.Reserve != nil {
			t[0] = w.key.(string)
		}
	} else {
		t[0] = w.key.(string)
	}
	if w.limit.Reserve != nil {
		t[2], t[3] = engine.ReservationKeys(w.base)
	}
	return t
}

// errExpired is the error of a request that Redis refused to decide because
// its deadline had passed: nothing was consumed.
var errExpired = errors.New("redis: the request reached Redis after its deadline (not decided, nothing consumed)")

// reply is the decide function's reply to one request (see prelude.lua): its verdict
// and instant, and unless expired each item's status, then the undo log
// and, in modeReserve when admitted, the view.
type reply struct {
	verdict  int64
	now      int64 // µs of the script's clock
	statuses []wireStatus
	// states replaces statuses in a reply of verdictAdmittedStates: per
	// item, its counter's state as the decision left it.
	states []engine.State
	// undo is the operations that give back what the decision wrote, in
	// release.lua's arguments (nil when the reply carries no undo log).
	undo []any
	// view is, per item, the remaining and reset µs of the state before
	// the request (modeReserve, admitted): what the request shows if its
	// reservation is given back.
	view []wireView
}

// wireStatus is one item's status in a reply.
type wireStatus struct {
	verdict          int64 // replyItem*: admitted, denied, or charged (minus what remained before the charge)
	remaining, reset int64
	retry            int64 // µs, or retryNever
	hold             wireHold
}

// wireHold is the reservations of an item whose rule reserves, in a
// reply (replyHoldFields).
type wireHold struct {
	phase, hits, held, holds, oldest, lapsed, lapsedHits int64
}

// wireView is one item of a reply's view.
type wireView struct{ remaining, reset int64 }

// parseReply reads the reply to a request of n items; holds[i] says
// whether item i's rule reserves (nil: none does).
func parseReply(v any, n int, holds []bool) (reply, error) {
	vals, ok := v.([]any)
	if !ok || len(vals) < replyHead {
		return reply{}, fmt.Errorf("redis: unexpected decide reply %v", v)
	}
	num := func(x any) int64 {
		i, _ := x.(int64)
		return i
	}
	r := reply{verdict: num(vals[0]), now: num(vals[1])}
	switch r.verdict {
	case verdictExpired:
		return r, nil
	case verdictAdmittedStates:
		return parseStates(r, vals[replyHead:], n)
	case verdictAdmitted, verdictDenied:
	default:
		return reply{}, fmt.Errorf("redis: decide reply with the unknown verdict %d", r.verdict)
	}
	rest := vals[replyHead:]
	width := replyItemFields * n
	for _, h := range holds {
		if h {
			width += replyHoldFields
		}
	}
	if len(rest) < width {
		return reply{}, fmt.Errorf("redis: decide reply of %d values for %d items: %v", len(vals), n, vals)
	}
	r.statuses = make([]wireStatus, n)
	for i := range r.statuses {
		f := rest
		r.statuses[i] = wireStatus{verdict: num(f[0]), remaining: num(f[1]), reset: num(f[2]), retry: num(f[3])}
		rest = rest[replyItemFields:]
		if holds != nil && holds[i] {
			h := &r.statuses[i].hold
			h.phase, h.hits, h.held, h.holds = num(rest[0]), num(rest[1]), num(rest[2]), num(rest[3])
			h.oldest, h.lapsed, h.lapsedHits = num(rest[4]), num(rest[5]), num(rest[6])
			rest = rest[replyHoldFields:]
		}
	}
	if len(rest) > 0 {
		undo, ok := rest[0].([]any)
		if !ok {
			return reply{}, fmt.Errorf("redis: decide reply: undo log %v", rest[0])
		}
		for _, op := range undo {
			f, ok := op.([]any)
			if !ok || len(f) < 2 {
				return reply{}, fmt.Errorf("redis: decide reply: undo operation %v", op)
			}
			r.undo = append(r.undo, f...)
		}
		if r.undo == nil {
			r.undo = []any{} // an empty log: nothing written
		}
		rest = rest[1:]
	}
	if len(rest) > 0 {
		view, ok := rest[0].([]any)
		if !ok || len(view) != 2*n {
			return reply{}, fmt.Errorf("redis: decide reply: view %v for %d items", rest[0], n)
		}
		r.view = make([]wireView, n)
		for i := range r.view {
			r.view[i] = wireView{remaining: num(view[2*i]), reset: num(view[2*i+1])}
		}
	}
	return r, nil
}

// parseStates reads the rest of a reply of verdictAdmittedStates to a
// request of n items: per item its counter's field (a state packed as
// stateNumber values: a token bucket's TAT; a window's start and count, and
// a sliding window's previous count), or nil for none.
func parseStates(r reply, fields []any, n int) (reply, error) {
	if len(fields) != n {
		return reply{}, fmt.Errorf("redis: decide reply of %d states for %d items: %v", len(fields), n, fields)
	}
	r.verdict = verdictAdmitted
	r.states = make([]engine.State, n)
	for i, f := range fields {
		if f == nil {
			continue // no state
		}
		v, ok := f.(string)
		if !ok {
			return reply{}, fmt.Errorf("redis: decide reply: state %v", f)
		}
		st := &r.states[i]
		switch len(v) {
		case 8:
			st.TAT = int64(stateNumberAt(v, 0))
		case 16, 24:
			st.Start, st.Count = int64(stateNumberAt(v, 0)), uint64(stateNumberAt(v, 1))
			if len(v) == 24 {
				st.Prev = uint64(stateNumberAt(v, 2))
			}
		default:
			return reply{}, fmt.Errorf("redis: decide reply: a state of %d bytes", len(v))
		}
	}
	return r, nil
}

// stateNumberAt returns number j of a state packed as stateNumber values.
func stateNumberAt(v string, j int) float64 {
	var u uint64
	for b := 8*j + 7; b >= 8*j; b-- {
		u = u<<8 | uint64(v[b])
	}
	return math.Float64frombits(u)
}

// results writes the reply's statuses into results, those of a reply
// that carries states computed for the rules of req's items, and returns
// whether the request was admitted.
func (r *reply) results(req *request, results []engine.Result) (bool, error) {
	if r.verdict == verdictExpired {
		return false, errExpired
	}
	if r.states != nil {
		now := time.UnixMicro(r.now)
		for i := range r.states {
			res := engine.Result{Admitted: true}
			res.Remaining, res.Reset = req.items[i].limit.Status(&r.states[i], now)
			results[i] = res
		}
		return true, nil
	}
	for i, st := range r.statuses {
		res := engine.Result{
			Remaining:  uint64(max(st.remaining, 0)),
			Reset:      time.Duration(st.reset) * time.Microsecond,
			RetryAfter: time.Duration(max(st.retry, 0)) * time.Microsecond,
			Never:      st.retry == retryNever,
		}
		if h := st.hold; h != (wireHold{}) {
			if h.phase < 0 || h.phase > int64(phaseSettlingUnheld) {
				return false, fmt.Errorf("redis: decide reply: item %d has the unknown phase %d", i, h.phase)
			}
			res.Phase, res.HoldHits = engine.Phase(h.phase), uint64(max(h.hits, 0))
			res.Held, res.Holds, res.OldestHold = uint64(max(h.held, 0)), uint32(max(h.holds, 0)), time.Duration(max(h.oldest, 0))*time.Microsecond
			res.Lapsed, res.LapsedHits = uint32(max(h.lapsed, 0)), uint64(max(h.lapsedHits, 0))
		}
		switch v := st.verdict; {
		case v == replyItemAdmitted:
			res.Admitted = true
		case v == replyItemDenied:
		case v == replyItemBlocked, v == replyItemBlockedCharged:
			res.Blocked = true
		case v <= replyItemCharged:
			res.RemainingBeforeCharge = uint64(replyItemCharged - v)
		default:
			return false, fmt.Errorf("redis: decide reply: item %d has the unknown verdict %d", i, v)
		}
		results[i] = res
	}
	return r.verdict == verdictAdmitted, nil
}
