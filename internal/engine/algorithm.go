package engine

import (
	"math"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
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
}

// LogEntry is hits logged at one instant by a sliding log.
type LogEntry struct {
	At   int64
	Hits uint64
}

// algorithm is one way of counting, whole: how it judges, consumes and gives
// back hits on a State, and the instants it reports. Instants are
// microseconds since the epoch. normalize turns the decision's instant into
// the counter's own (see below); every other method but expiry takes st
// normalized and that instant. Implementations are stateless values.
//
// Time can go backwards (an NTP step, another process's clock): a counter
// never resets or refills on a backward step. normalize returns the
// counter's instant, never earlier than what its state has seen (the start
// of its current window, its newest logged hit), and the other methods
// judge at that instant, as if no time had passed (x/time/rate does the
// same).
//
// The Redis script (internal/redisstore/scripts/decide.lua) holds the same
// functions, section by section, with the same arithmetic: a differential
// test holds the two to identical answers.
type algorithm interface {
	// normalize brings st to the decision's instant t without changing what
	// it means (window rollover, expired log entries dropped, a TAT not in
	// the past) and returns the counter's instant: t, or later when the
	// state has seen later instants. A store keeps the normalized state
	// whether or not the request is admitted.
	normalize(l *descriptors.Limit, st *State, t int64) int64
	// admits reports whether hits fit at t. With 0 hits it reports whether
	// the limit is not exceeded (a look that consumes nothing).
	admits(l *descriptors.Limit, st *State, t int64, hits uint64) bool
	// consume takes hits at t without checking the limit.
	consume(l *descriptors.Limit, st *State, t int64, hits uint64)
	// giveBack refunds hits at t; a counter never goes below zero and a
	// bucket never holds more than its burst.
	giveBack(l *descriptors.Limit, st *State, t int64, hits uint64)
	// remaining returns the hits the limit still admits at t.
	remaining(l *descriptors.Limit, st *State, t int64) uint64
	// resetAt returns the instant reported as the limit's reset (see
	// Result.Reset).
	resetAt(l *descriptors.Limit, st *State, t int64) int64
	// retryAt returns an instant no later than the first one at which hits
	// would be admitted, nothing else being consumed meanwhile, for a request
	// denied at t; never when no instant will admit them (more hits than
	// the limit, or the bucket, holds).
	retryAt(l *descriptors.Limit, st *State, t int64, hits uint64) int64
	// expiry returns the instant from which st is equivalent to the zero
	// State: a store may forget it then. 0 means it already is.
	expiry(l *descriptors.Limit, st *State) int64
}

// never is what retryAt returns for hits that no instant admits
// (Result.Never).
const never = math.MaxInt64

// algorithms holds the implementation of each descriptors.Algorithm.
var algorithms = [...]algorithm{
	descriptors.FixedWindow:   fixedWindow{},
	descriptors.SlidingWindow: slidingWindow{},
	descriptors.SlidingLog:    slidingLog{},
	descriptors.TokenBucket:   tokenBucket{},
}

// algorithmOf returns the implementation of l's algorithm: a fixed window
// with a calendar is a calendar window. The config admits no other
// algorithm, so an unknown one is a programmer error.
func algorithmOf(l *descriptors.Limit) algorithm {
	if l.Calendar != nil {
		return calendarWindow{}
	}
	return algorithms[l.Algorithm]
}

// Expiry returns the instant from which st is equivalent to the zero State
// for limit l: a store may forget it then. 0 means it already is.
func Expiry(l *descriptors.Limit, st *State) int64 {
	return algorithmOf(l).expiry(l, st)
}

// Capacity is the most hits that l can ever admit at once: its limit, or a
// token bucket's burst (none when it refills nothing). More hits are denied
// whatever the wait (Result.Never).
func Capacity(l *descriptors.Limit) uint64 {
	switch {
	case l.Algorithm != descriptors.TokenBucket:
		return uint64(l.RequestsPerUnit)
	case l.RequestsPerUnit == 0:
		return 0
	}
	return uint64(l.Burst)
}

// window returns the limit's window in microseconds (≥ 1 for a valid limit).
func window(l *descriptors.Limit) int64 { return l.Window.Microseconds() }

// windowStart returns the start of the epoch-aligned window holding t.
func windowStart(t, w int64) int64 { return t - t%w }

func micros(us int64) time.Duration {
	if us < 0 {
		return 0
	}
	return time.Duration(us) * time.Microsecond
}
