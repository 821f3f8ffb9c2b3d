package engine

import (
	"math"
	"strconv"
	"time"
)

// State is the stored state of one counter: one limit of one descriptor.
// The zero value is a counter that has seen nothing. Which fields are used
// depends on the limit's algorithm; each algorithm's file says which.
//
// All instants are microseconds since the Unix epoch. A State is not safe
// for concurrent use; stores guard it.
type State struct {
	Start int64      // window start (fixed and sliding windows)
	Count uint64     // hits in the window starting at Start (windows); in Log (sliding log)
	Prev  uint64     // hits in the window before Start (sliding window)
	TAT   int64      // theoretical arrival time (token bucket)
	Log   []LogEntry // the logged hits, oldest first (sliding log)
	// A limit with a penalty (penalty.go): the blocks earned since the
	// ladder last started over, and the end of the last one.
	Strikes      uint32
	BlockedUntil int64
	// A limit that reserves (reservation.go): the hits its reservations
	// hold now, counted in the algorithm's state as hits taken (a window's
	// or a log's Count, a bucket's TAT), and its reservation table (nil
	// for none).
	Held  uint64
	Holds *Holds
}

// LogEntry is hits logged at one instant by a sliding log.
type LogEntry struct {
	At   int64
	Hits uint64
}

// algorithm is one way of counting, whole: how it judges, consumes and gives
// back hits on a State, the instants it reports, and what it checks and
// derives when a Spec is compiled. Instants are microseconds since the
// epoch. normalize turns the decision's instant into the counter's own (see
// below); every other method but expiry takes st normalized and that
// instant. Implementations are stateless values; adding one is a file of
// its own and its line in algorithms (and a file of the Redis scripts: see
// doc.go).
//
// Time can go backwards (an NTP step, another process's clock): a counter
// never resets or refills on a backward step. normalize returns the
// counter's instant, never earlier than what its state has seen (the start
// of its current window, its newest logged hit), and the other methods
// judge at that instant, as if no time had passed (x/time/rate does the
// same).
//
// The Redis scripts hold the same functions, an algorithm's in its own
// file (internal/redisstore/scripts/alg/<name>.lua), with the same
// arithmetic: a differential test holds the two to identical answers.
type algorithm interface {
	// name is the algorithm's name (in configs, unless it is a form of
	// another: see form); code its stable code (Rule.Code).
	name() string
	code() uint8
	// compile checks what of s is the algorithm's own, completes r (its
	// burst), and returns the algorithm r counts with (itself; calendar: true
	// then turns a fixed window into a calendarWindow, see compileCalendar).
	compile(s *Spec, r *Rule, errs *specErrors) algorithm
	// counterID is the identity of r's counter without its name part.
	counterID(r *Rule) string
	// normalize brings st to the decision's instant t without changing what
	// it means (window rollover, expired log entries dropped, a TAT not in
	// the past) and returns the counter's instant: t, or later when the
	// state has seen later instants. A store keeps the normalized state
	// whether or not the request is admitted.
	normalize(r *Rule, st *State, t int64) int64
	// admits reports whether hits fit at t. With 0 hits it reports whether
	// the limit is not exceeded (a look that consumes nothing).
	admits(r *Rule, st *State, t int64, hits uint64) bool
	// consume takes hits at t without checking the limit.
	consume(r *Rule, st *State, t int64, hits uint64)
	// giveBack refunds hits at t; a counter never goes below zero and a
	// bucket never holds more than its burst.
	giveBack(r *Rule, st *State, t int64, hits uint64)
	// remaining returns the hits the limit still admits at t.
	remaining(r *Rule, st *State, t int64) uint64
	// resetAt returns the instant reported as the limit's reset (see
	// Result.Reset).
	resetAt(r *Rule, st *State, t int64) int64
	// retryAt returns an instant no later than the first one at which hits
	// would be admitted, nothing else being consumed meanwhile, for a request
	// denied at t; never when no instant will admit them (more hits than
	// the limit, or the bucket, holds).
	retryAt(r *Rule, st *State, t int64, hits uint64) int64
	// expiry returns the instant from which st is equivalent to the zero
	// State: a store may forget it then. 0 means it already is.
	expiry(r *Rule, st *State) int64
	// hold takes a reserve's hits at t: counted as hits taken, beside a
	// sliding log's entries (not one of them); unhold gives a hold's hits
	// back at t, when it is settled or ends by itself (the caller keeps
	// Held). canHold says whether the algorithm can hold at all, and
	// whyNoHold, when it cannot, why (for the config's message). Each
	// window algorithm also carries the hits held into each new window in
	// normalize (reservation.go).
	hold(r *Rule, st *State, t int64, hits uint64)
	unhold(r *Rule, st *State, t int64, hits uint64)
	canHold() bool
	whyNoHold() string
	// capacity, quotaWindow, denialCoversMoreHits, stateSizeVaries,
	// leasable, refills, inFlight, windowInIdentity and calendarBounds
	// answer Rule's methods of the same names: what the code outside the
	// engine asks of a rule instead of testing its algorithm's name.
	capacity(r *Rule) uint64
	quotaWindow(r *Rule, end time.Time) time.Duration
	denialCoversMoreHits() bool
	stateSizeVaries() bool
	leasable() bool
	refills() bool
	inFlight() bool
	windowInIdentity() bool
	calendarBounds(r *Rule, at int64) ([4]int64, bool)
}

// form is an algorithm that configs do not name: a form of another, which
// compile turns into it (a calendar window is a fixed window with
// calendar: true). configName is the name of that other.
type form interface {
	configName() string
}

// configName returns the name configs give a.
func configName(a algorithm) string {
	if f, ok := a.(form); ok {
		return f.configName()
	}
	return a.name()
}

// never is what retryAt returns for hits that no instant admits
// (Result.Never).
const never = math.MaxInt64

// algorithms are the implementations by code. The codes are part of the
// Redis store's wire contract (each algorithm's script registers its code,
// ALG_<NAME>; the store's TestWireContract checks them against this
// table): append only.
var algorithms = [...]algorithm{
	fixedWindow{},
	slidingWindow{},
	slidingLog{},
	tokenBucket{},
	calendarWindow{},
	concurrency{},
}

// Algorithms returns the algorithms' names by code (index): what a store
// that mirrors them must know.
func Algorithms() []string {
	names := make([]string, len(algorithms))
	for i, a := range algorithms {
		names[i] = a.name()
	}
	return names
}

// windowQuota is quotaWindow of the algorithms whose quota is their limit
// per their window.
func windowQuota(r *Rule, _ time.Time) time.Duration { return r.Window }

// limitCapacity is the capacity of the algorithms that admit at most their
// limit at once.
func limitCapacity(r *Rule) uint64 { return uint64(r.Limit) }

// noBurst is the check of the algorithms that have no burst.
func noBurst(s *Spec, r *Rule, errs *specErrors) {
	if s.Burst.Set {
		errs.add("burst", true, "burst is only for algorithm token_bucket, not %s", r.alg.name())
	}
}

// noCalendarBounds is calendarBounds of the algorithms whose window is a
// length.
func noCalendarBounds(*Rule, int64) ([4]int64, bool) { return [4]int64{}, false }

// uitoa is strconv.FormatUint in base 10.
func uitoa(v uint64) string { return strconv.FormatUint(v, 10) }

// windowStart returns the start of the epoch-aligned window holding t.
func windowStart(t, w int64) int64 { return t - t%w }

func micros(us int64) time.Duration {
	if us < 0 {
		return 0
	}
	return time.Duration(us) * time.Microsecond
}
