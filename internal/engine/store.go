package engine

import (
	"context"
	"math"
	"time"
)

// MaxHits bounds the hits of one item. Requests asking for more are rejected
// before they reach a store, so no counter arithmetic can overflow: a counter
// holds at most a limit (< 2^32) plus one request's hits, or, with hits that
// count when denied, what 2^32 such requests add (a window's count), and a
// bucket's TAT stops MaxBucketAhead ahead of now.
const MaxHits = math.MaxUint32

// Item is one limit of one request descriptor, as a store judges it.
type Item struct {
	// Desc identifies the request descriptor's counters: the output of
	// AppendDescriptorKey. Items with equal Desc and Rule.ID share a
	// counter: (Desc, Rule.ID) is the counter's identity, which every store
	// keys its state by (key.go).
	Desc string
	// Rule is the compiled limit (configured, or a request's override).
	Rule *Rule
	// Hits to consume (0 = only look), at most MaxHits.
	Hits uint64
	// Refund gives Hits back instead of consuming them (is_negative_hits).
	// A refund always admits; counters never go below zero.
	Refund bool
	// Shadow items are judged and consumed like the others when they admit,
	// but never deny the request.
	Shadow bool
	// CountDenied items take their hits whether or not they or the request
	// are admitted (count_denied_hits; envoyproxy/ratelimit's rule): the
	// counter may go into debt, reads 0 remaining, and denies until its
	// window, log or bucket has room again. Not with Refund.
	CountDenied bool
	// Group is 0 for an ordinary item. Items with the same non-zero Group
	// form one quota_mode descriptor: the quota groups of a request deny it
	// only when every one of them is over.
	Group int32
	// Reservation is the id of the request's reservation on the
	// descriptor (ReservationID of its reservation_key entry), "" for
	// none. With a rule that reserves it makes the item a reservation call
	// (Reserving, reservation.go): the first call with the id reserves, a
	// later one settles. Not part of the counter's identity.
	Reservation string
}

// Result is what a store found for one item.
type Result struct {
	// Admitted is the item's own verdict at the decision's instant: its
	// limit would admit Hits. A shadow or quota item may be !Admitted in an
	// admitted request.
	Admitted bool
	// Remaining is how many more hits the limit admits after this request
	// (after its consumption when the request was admitted, or when the
	// item is CountDenied).
	Remaining uint64
	// RemainingBeforeCharge, for a CountDenied item that did not admit
	// (its hits were charged all the same), is how many more hits its limit
	// admitted just before that charge, as Remaining is read after it: what
	// envoyproxy/ratelimit's stats split a denial's hits by. 0 for every
	// other item.
	RemainingBeforeCharge uint64
	// Reset is the time until the limit's current window ends (fixed and
	// sliding windows), until the bucket is full again (token bucket), or
	// until the oldest logged hit leaves the window (sliding log).
	Reset time.Duration
	// RetryAfter, for an item that did not admit, is the time until the same
	// Hits could be admitted if nothing else were consumed meanwhile; it is
	// never later than the true instant. 0 for admitted items, and when Never.
	RetryAfter time.Duration
	// Never marks an item that did not admit and never can, however long it
	// waits: its Hits are more than the limit's RequestsPerUnit (more than
	// its Burst for a token bucket; any hit for a limit of 0). There is no
	// retry instant to report: RetryAfter is 0.
	Never bool
	// Cached marks a denial answered from a denial cache without a round
	// trip to the store.
	Cached bool
	// Blocked marks a denial by the block that a penalty put on the
	// counter (penalty.go), not by its count: RetryAfter is the block's end,
	// or later when the count would still deny then; RemainingBeforeCharge
	// is 0.
	Blocked bool

	// Of a reservation call (reservation.go): Phase is what it was, and
	// HoldHits the hits it held (a reserve of an admitted request) or
	// released (a settle of a hold), else 0. A settle admits whatever
	// its hits; a reserve is judged as its hold's hits.
	Phase    Phase
	HoldHits uint64
	// Of an item whose rule reserves: Held is the hits its counter's
	// reservations hold after the decision (counted in Remaining), Holds
	// their number, and OldestHold (Peek only) the age of the oldest.
	// Lapsed and LapsedHits are the holds of the counter that ended by
	// themselves at this decision (their ttl passed; released, charging
	// nothing), on the first item of the request on that counter.
	Held       uint64
	Holds      uint32
	OldestHold time.Duration
	Lapsed     uint32
	LapsedHits uint64
}

// Store keeps counters and decides requests. Every store of rls (memstore,
// redisstore) and every layer over one (the lease layer) is a whole Store:
// what the service asks of its store (deciding, readiness, reset) is here,
// never found by a type assertion, so that a layer cannot hide it.
//
// Apply judges every item at one instant of the store's clock. If every
// item that is neither shadow nor in a quota group admits, and (when there
// are quota groups) at least one quota group admits entirely, the request is
// admitted and every admitting item outside a failing quota group is
// consumed; otherwise nothing is consumed. It writes results[i] for items[i]
// (len(results) ≥ len(items)) and reports whether the request is admitted.
// The rule is the one of Evaluate, which a Go store may call directly.
//
// On error nothing was consumed, or the store cannot tell (a timeout after
// the request was sent); results are then undefined. A store that does I/O
// bounds each call by its own timeout and by ctx, and returns an error
// wrapping ctx.Err() when ctx ends first; a store that never waits on I/O
// only refuses a ctx that is already done. Implementations are safe for
// concurrent use.
//
// Peek judges items as Apply would at the store's clock and consumes
// nothing (a dry run): results as engine.Peek gives them (verdicts, and the
// remaining and reset of each limit before the request); it reports whether
// Apply would admit the request now. Errors as Apply's.
//
// Reset clears counters (POST /admin/reset): it forgets the state of each
// item's counter (Desc, Rule.ID), whatever its algorithm (a window's
// count, a bucket's level, a log), as if it had never been used, and
// returns how many of them held state. Hits, Refund and the other fields
// of the items are ignored. Errors as Apply's: on error some counters may
// have been cleared.
//
// Ping says whether the store can decide now, for readiness: nil when it
// can (always, for a store in memory), else why not (a remote store that
// does not answer). It bounds itself by ctx.
type Store interface {
	Apply(ctx context.Context, items []Item, results []Result) (admitted bool, err error)
	Peek(ctx context.Context, items []Item, results []Result) (admitted bool, err error)
	Reset(ctx context.Context, items []Item) (cleared int, err error)
	Ping(ctx context.Context) error
}
