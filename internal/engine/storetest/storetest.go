// Package storetest is the conformance suite that every engine.Store must
// pass: timelines of requests at explicit instants, with the verdicts,
// remaining counts and durations that docs/design.md and the README prescribe, plus the
// all-or-nothing, shadow, quota and concurrency rules.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// NewStore returns a fresh, empty store whose clock is now. The store must be
// closed by the factory's own t.Cleanup.
type NewStore func(t *testing.T, now func() time.Time) engine.Store

// Clock is a settable clock for stores under test. Safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's reading.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// T0 is the suite's first instant: aligned to the second, minute and hour.
var T0 = time.Unix(1_800_000_000, 0)

const (
	sec = time.Second
	ms  = time.Millisecond
	us  = time.Microsecond
)

// Rule builds the rule of algorithm alg with a limit of rpu per window
// (whole seconds) and, for a token bucket, burst, as a config would. A
// concurrency rule's window is its lease_ttl (its unit a second).
func Rule(alg string, rpu uint32, window time.Duration, burst uint32) *engine.Rule {
	s := engine.Spec{
		Algorithm: alg, Limit: rpu, Unit: engine.Second, Multiplier: uint32(window / time.Second),
		Burst: engine.Opt[uint32]{V: burst, Set: alg == engine.TokenBucket},
	}
	if alg == engine.Concurrency {
		s.Multiplier, s.LeaseTTL = 1, engine.Some(window)
	}
	return engine.MustCompile(s)
}

// PenaltyRule is Rule with a penalty: its ladder and reset.
func PenaltyRule(alg string, rpu uint32, window time.Duration, ladder []time.Duration, reset time.Duration) *engine.Rule {
	return engine.MustCompile(engine.Spec{
		Algorithm: alg, Limit: rpu, Unit: engine.Second, Multiplier: uint32(window / time.Second),
		Penalty: ladder, PenaltyReset: engine.Some(reset),
	})
}

// Seed returns the seed of a randomized test: RLS_TEST_SEED when set (to
// replay a failure), else a fresh one. It logs it, and the test's failure
// messages print it too.
func Seed(t testing.TB) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("RLS_TEST_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("RLS_TEST_SEED=%q: %v", v, err)
		}
		seed = n
	}
	t.Logf("seed %d (replay with RLS_TEST_SEED=%d)", seed, seed)
	return seed
}

// CalendarRule builds a calendar rule (calendar: true) of unit in loc, as
// the config would.
func CalendarRule(unit engine.Unit, rpu uint32, loc *time.Location) *engine.Rule {
	return engine.MustCompile(engine.Spec{
		Limit: rpu, Unit: unit, Multiplier: 1, Calendar: true, TimeZone: engine.Some(loc.String()),
	})
}

// since returns the instant given in loc as an offset from T0 (2027-01-15
// 08:00 UTC, a Friday).
func since(loc *time.Location, y int, mo time.Month, d, h, mi int) time.Duration {
	return time.Date(y, mo, d, h, mi, 0, 0, loc).Sub(T0)
}

var paris = func() *time.Location {
	loc, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		panic(err) // the time zone database is embedded (time/tzdata, imported by config and engine)
	}
	return loc
}()

// WindowID returns the ID of rule l with its window when its window is
// not part of its ID already (a concurrency limit's lease_ttl), for tests
// that draw limits of every algorithm and window and mean one counter per
// window. A counter shared by two lease_ttls (requests decided under the
// configs before and after a reload) is judged by each request's own; the
// stores forget its state by the lease_ttl of the request that touched it
// last (memstore) or last changed it (Redis), which the differential tests
// leave out.
func WindowID(l *engine.Rule) string {
	if l.InFlight() {
		return l.ID + "@" + l.Window.String()
	}
	return l.ID
}

// Algorithms returns every algorithm the config knows, for tests that draw
// limits of all of them.
func Algorithms() []string { return strings.Split(engine.AlgorithmNames(), "|") }

// Run runs the whole suite against stores made by newStore. The timelines
// below are the one table of each algorithm's behaviour: the engine runs
// them against a plain reference store, memstore and redisstore against
// themselves.
func Run(t *testing.T, newStore NewStore) {
	for _, tl := range timelines {
		t.Run(tl.name, func(t *testing.T) { testTimeline(t, newStore, tl) })
	}
	t.Run("HugeHits", func(t *testing.T) { testHugeHits(t, newStore) })
	t.Run("AllOrNothingWindows", func(t *testing.T) { testAllOrNothingWindows(t, newStore) })
	t.Run("AllOrNothingDescriptors", func(t *testing.T) { testAllOrNothingDescriptors(t, newStore) })
	t.Run("DeniedRequestLeavesStateAsItWas", func(t *testing.T) { testDeniedRestores(t, newStore) })
	t.Run("Shadow", func(t *testing.T) { testShadow(t, newStore) })
	t.Run("QuotaGroups", func(t *testing.T) { testQuota(t, newStore) })
	t.Run("SameCounterTwice", func(t *testing.T) { testSameCounterTwice(t, newStore) })
	t.Run("PeekIsApplyWithoutConsuming", func(t *testing.T) { testPeek(t, newStore) })
	t.Run("CountDeniedPassesAfterItsCharge", func(t *testing.T) { testCountDeniedPassesAfterItsCharge(t, newStore) })
	t.Run("CountDeniedRemainingBeforeCharge", func(t *testing.T) { testCountDeniedRemainingBeforeCharge(t, newStore) })
	t.Run("CountersAreSeparate", func(t *testing.T) { testSeparate(t, newStore) })
	t.Run("ExpiredStateForgotten", func(t *testing.T) { testExpired(t, newStore) })
	t.Run("CancelledContext", func(t *testing.T) { testCancelled(t, newStore) })
	t.Run("NoItems", func(t *testing.T) { testNoItems(t, newStore) })
	t.Run("ConcurrentExactlyTheLimit", func(t *testing.T) { testConcurrent(t, newStore) })
	t.Run("Reset", func(t *testing.T) { testReset(t, newStore) })
}

// testReset: Reset clears every counter of the items, whatever the
// algorithm, and says how many held state; other counters keep theirs.
func testReset(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	rules := []*engine.Rule{
		Rule(engine.FixedWindow, 2, time.Minute, 0),
		Rule(engine.SlidingWindow, 3, time.Hour, 0),
		Rule(engine.SlidingLog, 4, time.Minute, 0),
		Rule(engine.TokenBucket, 2, time.Minute, 2),
		Rule(engine.FixedWindow, 5, time.Second, 0), // a per-second Redis's
		CalendarRule(engine.Day, 6, time.UTC),
		Rule(engine.Concurrency, 3, 30*time.Second, 0),
	}
	reset, kept := uniqueDesc(t, "ip=1"), uniqueDesc(t, "ip=2")
	items := func(desc string) []engine.Item {
		var out []engine.Item
		for _, l := range rules {
			out = append(out, engine.Item{Desc: desc, Rule: l, Hits: 1})
		}
		return out
	}
	for _, desc := range []string{reset, kept} {
		for _, it := range items(desc) {
			for range it.Rule.Limit {
				if ok, _ := apply(t, s, []engine.Item{it}); !ok {
					t.Fatalf("%s: setup hit denied", it.Rule.ID)
				}
			}
		}
	}
	n, err := s.Reset(context.Background(), items(reset))
	if err != nil {
		t.Fatal(err)
	}
	if n != len(rules) {
		t.Errorf("Reset of %d used counters cleared %d", len(rules), n)
	}
	for _, it := range items(reset) {
		if ok, res := apply(t, s, []engine.Item{it}); !ok || res[0].Remaining != uint64(it.Rule.Limit)-1 {
			t.Errorf("%s after Reset: admitted %v remaining %d, want true remaining %d", it.Rule.ID, ok, res[0].Remaining, it.Rule.Limit-1)
		}
	}
	for _, it := range items(kept) {
		if ok, _ := apply(t, s, []engine.Item{it}); ok {
			t.Errorf("%s of another descriptor admitted after a Reset: its counter was cleared too", it.Rule.ID)
		}
	}
	if n, err := s.Reset(context.Background(), items(uniqueDesc(t, "ip=3"))); err != nil || n != 0 {
		t.Errorf("Reset of counters never used: %d, %v; want 0, nil", n, err)
	}
	// A penalty's block goes with its counter: one counter cleared.
	blocked := []engine.Item{{Desc: uniqueDesc(t, "ip=4"), Rule: PenaltyRule(engine.FixedWindow, 1, time.Minute, []time.Duration{time.Hour}, time.Hour), Hits: 1}}
	apply(t, s, blocked)
	if ok, res := apply(t, s, blocked); ok || res[0].Blocked {
		t.Fatalf("a penalized counter's first denial: admitted %v, blocked %v; want a strike (false, false)", ok, res[0].Blocked)
	}
	if n, err := s.Reset(context.Background(), blocked); err != nil || n != 1 {
		t.Errorf("Reset of a blocked counter: %d, %v; want 1, nil", n, err)
	}
	if ok, res := apply(t, s, blocked); !ok {
		t.Errorf("a reset counter is still blocked: %+v", res[0])
	}
}

// step is one single-item request of a timeline.
type step struct {
	at        time.Duration // since T0
	hits      uint64
	refund    bool
	cd        bool // count_denied_hits: the hits count whether or not admitted
	ok        bool
	remaining uint64
	reset     time.Duration
	retry     time.Duration // checked on denied steps
	never     bool          // a denial that no wait lifts (Result.Never): retry 0
	before    uint64        // a denied count-denied step: remaining before its charge (else 0)
	blocked   bool          // denied by a penalty's block (Result.Blocked)
}

type timeline struct {
	name  string
	limit *engine.Rule
	steps []step
}

var timelines = []timeline{
	// Each denial by the count blocks for the next step of the ladder; the
	// requests of a block are denied (a look too) and are no strikes; the
	// ladder starts over after 30 minutes without one.
	{"Penalty", PenaltyRule(engine.FixedWindow, 2, time.Minute, []time.Duration{2 * time.Minute, 10 * time.Minute}, 30*time.Minute), []step{
		{at: 0, hits: 1, ok: true, remaining: 1, reset: 60 * sec},
		{at: 1 * sec, hits: 1, ok: true, remaining: 0, reset: 59 * sec},
		{at: 2 * sec, hits: 1, ok: false, remaining: 0, reset: 120 * sec, retry: 120 * sec}, // strike 1: blocked until 122s
		{at: 70 * sec, hits: 1, ok: false, remaining: 0, reset: 52 * sec, retry: 52 * sec, blocked: true},
		{at: 71 * sec, hits: 0, ok: false, remaining: 0, reset: 51 * sec, retry: 51 * sec, blocked: true},
		{at: 72 * sec, hits: 1, refund: true, ok: true, remaining: 0, reset: 50 * sec}, // a refund passes
		{at: 122 * sec, hits: 1, ok: true, remaining: 1, reset: 58 * sec},
		{at: 123 * sec, hits: 1, ok: true, remaining: 0, reset: 57 * sec},
		{at: 124 * sec, hits: 1, ok: false, remaining: 0, reset: 600 * sec, retry: 600 * sec}, // strike 2: 10m
		{at: 724 * sec, hits: 1, ok: true, remaining: 1, reset: 56 * sec},
		{at: 725 * sec, hits: 1, ok: true, remaining: 0, reset: 55 * sec},
		{at: 726 * sec, hits: 1, ok: false, remaining: 0, reset: 600 * sec, retry: 600 * sec}, // strike 3: the last step again
		{at: 1326*sec + 30*60*sec, hits: 1, ok: true, remaining: 1, reset: 54 * sec},
		{at: 1327*sec + 30*60*sec, hits: 1, ok: true, remaining: 0, reset: 53 * sec},
		{at: 1328*sec + 30*60*sec, hits: 1, ok: false, remaining: 0, reset: 120 * sec, retry: 120 * sec}, // started over: 2m
	}},
	// A sliding log's penalty lives beside its sorted set.
	{"PenaltySlidingLog", PenaltyRule(engine.SlidingLog, 1, time.Minute, []time.Duration{time.Minute}, time.Hour), []step{
		{at: 0, hits: 1, ok: true, remaining: 0, reset: 60 * sec},
		{at: 10 * sec, hits: 1, ok: false, remaining: 0, reset: 60 * sec, retry: 60 * sec}, // blocked until 70s
		{at: 65 * sec, hits: 1, ok: false, remaining: 0, reset: 5 * sec, retry: 5 * sec, blocked: true},
		{at: 70 * sec, hits: 1, ok: true, remaining: 0, reset: 60 * sec},
	}},
	{"FixedWindow", Rule(engine.FixedWindow, 3, time.Minute, 0), []step{
		{at: 0, hits: 1, ok: true, remaining: 2, reset: 60 * sec},
		{at: 1 * sec, hits: 2, ok: true, remaining: 0, reset: 59 * sec},
		{at: 2 * sec, hits: 1, ok: false, remaining: 0, reset: 58 * sec, retry: 58 * sec},
		{at: 2 * sec, hits: 0, ok: true, remaining: 0, reset: 58 * sec}, // a look at the limit is OK
		{at: 60*sec - us, hits: 1, ok: false, remaining: 0, reset: us, retry: us},
		{at: 60 * sec, hits: 1, ok: true, remaining: 2, reset: 60 * sec}, // new window
		{at: 61 * sec, hits: 4, ok: false, remaining: 2, reset: 59 * sec, never: true},
		{at: 62 * sec, hits: 2, ok: true, remaining: 0, reset: 58 * sec}, // the denial cost nothing
		{at: 63 * sec, hits: 2, refund: true, ok: true, remaining: 2, reset: 57 * sec},
		{at: 64 * sec, hits: 9, refund: true, ok: true, remaining: 3, reset: 56 * sec}, // never below zero
	}},
	{"FixedWindowZeroLimit", Rule(engine.FixedWindow, 0, time.Second, 0), []step{
		{at: 0, hits: 1, ok: false, remaining: 0, reset: sec, never: true},
		{at: 0, hits: 0, ok: true, remaining: 0, reset: sec},
	}},
	{"SlidingWindow", Rule(engine.SlidingWindow, 10, time.Minute, 0), []step{
		{at: -30 * sec, hits: 10, ok: true, remaining: 0, reset: 30 * sec},
		// At T0 the previous window still weighs fully: 10 of 10.
		{at: 0, hits: 1, ok: false, remaining: 0, reset: 60 * sec, retry: 6*sec - us},
		{at: 6*sec - us, hits: 1, ok: false, remaining: 0, reset: 54*sec + us, retry: us},
		// At T0+6s the previous window weighs 54/60: 9 of 10.
		{at: 6 * sec, hits: 1, ok: true, remaining: 0, reset: 54 * sec},
		// At T0+30s: 10×0.5 + 1 = 6.
		{at: 30 * sec, hits: 0, ok: true, remaining: 4, reset: 30 * sec},
		{at: 30 * sec, hits: 5, ok: false, remaining: 4, reset: 30 * sec, retry: 6*sec - us},
		{at: 30 * sec, hits: 4, ok: true, remaining: 0, reset: 30 * sec},
		// Two windows later everything is forgotten.
		{at: 120 * sec, hits: 10, ok: true, remaining: 0, reset: 60 * sec},
		{at: 121 * sec, hits: 3, refund: true, ok: true, remaining: 3, reset: 59 * sec},
	}},
	// The current window alone is full: only the next window, where it
	// becomes the previous one and decays, can admit.
	{"SlidingWindowNextWindow", Rule(engine.SlidingWindow, 10, time.Minute, 0), []step{
		{at: 0, hits: 10, ok: true, remaining: 0, reset: 60 * sec},
		// 10×(60-e)/60 + 5 ≤ 10 from e = 30s of the next window.
		{at: 10 * sec, hits: 5, ok: false, remaining: 0, reset: 50 * sec, retry: 80*sec - us},
		{at: 90 * sec, hits: 5, ok: true, remaining: 0, reset: 30 * sec},
		{at: 91 * sec, hits: 11, ok: false, remaining: 0, reset: 29 * sec, never: true},
	}},
	{"SlidingLog", Rule(engine.SlidingLog, 3, time.Minute, 0), []step{
		{at: 0, hits: 1, ok: true, remaining: 2, reset: 60 * sec},
		{at: 10 * sec, hits: 1, ok: true, remaining: 1, reset: 50 * sec},
		{at: 20 * sec, hits: 1, ok: true, remaining: 0, reset: 40 * sec},
		{at: 30 * sec, hits: 1, ok: false, remaining: 0, reset: 30 * sec, retry: 30 * sec},
		{at: 30 * sec, hits: 2, ok: false, remaining: 0, reset: 30 * sec, retry: 40 * sec},
		{at: 60*sec - us, hits: 1, ok: false, remaining: 0, reset: us, retry: us},
		{at: 60 * sec, hits: 1, ok: true, remaining: 0, reset: 10 * sec}, // the hit of T0 left
		{at: 61 * sec, hits: 1, refund: true, ok: true, remaining: 1, reset: 9 * sec},
		{at: 61 * sec, hits: 4, ok: false, remaining: 1, reset: 9 * sec, never: true},
		{at: 200 * sec, hits: 0, ok: true, remaining: 3, reset: 0},
	}},
	// Requests in flight (algorithm: concurrency, lease_ttl 30s): hits
	// acquire, refunds release (the newest acquisitions first, never below
	// zero), and an acquisition never released frees its slot lease_ttl
	// after it was taken.
	{"Concurrency", Rule(engine.Concurrency, 3, 30*time.Second, 0), []step{
		{at: 0, hits: 1, ok: true, remaining: 2, reset: 30 * sec},
		{at: 1 * sec, hits: 1, ok: true, remaining: 1, reset: 29 * sec},
		{at: 2 * sec, hits: 1, ok: true, remaining: 0, reset: 28 * sec},
		{at: 3 * sec, hits: 1, ok: false, remaining: 0, reset: 27 * sec, retry: 27 * sec},
		{at: 3 * sec, hits: 4, ok: false, remaining: 0, reset: 27 * sec, never: true},
		{at: 4 * sec, hits: 1, refund: true, ok: true, remaining: 1, reset: 26 * sec},
		{at: 5 * sec, hits: 1, ok: true, remaining: 0, reset: 25 * sec},
		{at: 6 * sec, hits: 5, refund: true, ok: true, remaining: 3, reset: 0}, // never below zero
		{at: 6 * sec, hits: 1, refund: true, ok: true, remaining: 3, reset: 0},
		// Three acquisitions whose releases are lost: their slots come back
		// 30s after they were taken.
		{at: 10 * sec, hits: 2, ok: true, remaining: 1, reset: 30 * sec},
		{at: 20 * sec, hits: 1, ok: true, remaining: 0, reset: 20 * sec},
		{at: 40*sec - us, hits: 1, ok: false, remaining: 0, reset: us, retry: us},
		{at: 40 * sec, hits: 1, ok: true, remaining: 1, reset: 10 * sec},
		{at: 41 * sec, hits: 1, refund: true, ok: true, remaining: 2, reset: 9 * sec},
		{at: 100 * sec, hits: 0, ok: true, remaining: 3, reset: 0},
	}},
	// Steady traffic does not keep a lost acquisition's slot: each release
	// frees the newest acquisition, so the one of T0, never released, is
	// still the oldest entry and leaves at T0+10s.
	{"ConcurrencyLostReleaseUnderTraffic", Rule(engine.Concurrency, 2, 10*time.Second, 0), []step{
		{at: 0, hits: 1, ok: true, remaining: 1, reset: 10 * sec}, // its release is lost
		{at: 1 * sec, hits: 1, ok: true, remaining: 0, reset: 9 * sec},
		{at: 2 * sec, hits: 1, refund: true, ok: true, remaining: 1, reset: 8 * sec},
		{at: 3 * sec, hits: 1, ok: true, remaining: 0, reset: 7 * sec},
		{at: 4 * sec, hits: 1, refund: true, ok: true, remaining: 1, reset: 6 * sec},
		{at: 9 * sec, hits: 1, ok: true, remaining: 0, reset: sec},
		{at: 9 * sec, hits: 1, ok: false, remaining: 0, reset: sec, retry: sec},
		{at: 10 * sec, hits: 1, ok: true, remaining: 0, reset: 9 * sec},
	}},
	// Envoy sends the release of a request its rate-limit filter denied
	// too: with count_denied_hits the denied request holds a slot (past the
	// limit) until that release, so it frees nobody else's. In a full log
	// its hits join the newest entry at that entry's instant: denials never
	// renew an acquisition's lease, and a denied request whose release is
	// lost leaves with that entry.
	{"ConcurrencyCountDenied", Rule(engine.Concurrency, 2, 30*time.Second, 0), []step{
		{at: 0, hits: 1, cd: true, ok: true, remaining: 1, reset: 30 * sec},
		{at: 0, hits: 1, cd: true, ok: true, remaining: 0, reset: 30 * sec}, // both releases are lost
		{at: 29 * sec, hits: 1, cd: true, ok: false, remaining: 0, reset: sec, retry: sec},
		{at: 29 * sec, hits: 1, refund: true, ok: true, remaining: 0, reset: sec}, // the denied one's release
		{at: 30 * sec, hits: 1, cd: true, ok: true, remaining: 1, reset: 30 * sec},
		{at: 31 * sec, hits: 1, cd: true, ok: true, remaining: 0, reset: 29 * sec},
		{at: 40 * sec, hits: 1, cd: true, ok: false, remaining: 0, reset: 20 * sec, retry: 21 * sec}, // its release is lost
		{at: 61 * sec, hits: 0, ok: true, remaining: 2, reset: 0},
	}},
	// The clock steps back (NTP, another process): a counter that has seen
	// a later window stays in it, as if no time passed (the review's bug: a
	// limit of 3 admitted 6 within one minute).
	{"FixedWindowClockStepsBack", Rule(engine.FixedWindow, 3, time.Minute, 0), []step{
		{at: 61 * sec, hits: 2, ok: true, remaining: 1, reset: 59 * sec},
		{at: 59 * sec, hits: 1, ok: true, remaining: 0, reset: 61 * sec},
		{at: 30 * sec, hits: 1, ok: false, remaining: 0, reset: 90 * sec, retry: 90 * sec},
		{at: 62 * sec, hits: 0, ok: true, remaining: 0, reset: 58 * sec},
		{at: 120 * sec, hits: 1, ok: true, remaining: 2, reset: 60 * sec},
	}},
	{"SlidingWindowClockStepsBack", Rule(engine.SlidingWindow, 10, time.Minute, 0), []step{
		{at: 0, hits: 10, ok: true, remaining: 0, reset: 60 * sec},
		{at: 90 * sec, hits: 5, ok: true, remaining: 0, reset: 30 * sec},
		// Back in the first window: judged at the start of the second one,
		// where the first still weighs fully.
		{at: 30 * sec, hits: 1, ok: false, remaining: 0, reset: 90 * sec, retry: 66*sec - us},
		{at: 90 * sec, hits: 0, ok: true, remaining: 0, reset: 30 * sec},
	}},
	{"SlidingLogClockStepsBack", Rule(engine.SlidingLog, 3, time.Minute, 0), []step{
		{at: 10 * sec, hits: 1, ok: true, remaining: 2, reset: 60 * sec},
		{at: 20 * sec, hits: 1, ok: true, remaining: 1, reset: 50 * sec},
		// Back before the newest hit: logged at its instant, the log stays
		// in order.
		{at: 5 * sec, hits: 1, ok: true, remaining: 0, reset: 65 * sec},
		{at: 15 * sec, hits: 1, ok: false, remaining: 0, reset: 55 * sec, retry: 55 * sec},
		{at: 70 * sec, hits: 1, ok: true, remaining: 0, reset: 10 * sec},
	}},
	// The bucket never refills on a backward step: it seems emptier by the
	// step, as its state has no instant of its own.
	{"TokenBucketClockStepsBack", Rule(engine.TokenBucket, 10, time.Second, 10), []step{
		{at: 1 * sec, hits: 10, ok: true, remaining: 0, reset: sec},
		{at: 500 * ms, hits: 1, ok: false, remaining: 0, reset: 1500 * ms, retry: 600 * ms},
		{at: 1100 * ms, hits: 1, ok: true, remaining: 0, reset: sec},
	}},
	// count_denied_hits (an LLM token budget charged at stream end): a
	// denied request's hits count too, into debt; remaining reads 0 and
	// requests are denied until the window, log or bucket has room again.
	{"FixedWindowCountDenied", Rule(engine.FixedWindow, 10, time.Minute, 0), []step{
		{at: 0, hits: 9, cd: true, ok: true, remaining: 1, reset: 60 * sec},
		{at: 1 * sec, hits: 5, cd: true, ok: false, remaining: 0, reset: 59 * sec, retry: 59 * sec, before: 1},
		{at: 2 * sec, hits: 1, cd: true, ok: false, remaining: 0, reset: 58 * sec, retry: 58 * sec},
		{at: 3 * sec, hits: 0, ok: false, remaining: 0, reset: 57 * sec, retry: 57 * sec}, // in debt, even a look is over
		{at: 60 * sec, hits: 1, cd: true, ok: true, remaining: 9, reset: 60 * sec},
	}},
	{"SlidingWindowCountDenied", Rule(engine.SlidingWindow, 10, time.Minute, 0), []step{
		{at: 0, hits: 10, cd: true, ok: true, remaining: 0, reset: 60 * sec},
		// 15 counted: the next window's weight of it has to fall to 5.
		{at: 1 * sec, hits: 5, cd: true, ok: false, remaining: 0, reset: 59 * sec, retry: 99*sec - us},
		{at: 90 * sec, hits: 0, ok: true, remaining: 2, reset: 30 * sec},
	}},
	{"SlidingLogCountDenied", Rule(engine.SlidingLog, 3, time.Minute, 0), []step{
		{at: 0, hits: 2, cd: true, ok: true, remaining: 1, reset: 60 * sec},
		{at: 10 * sec, hits: 2, cd: true, ok: false, remaining: 0, reset: 50 * sec, retry: 60 * sec, before: 1},
		{at: 20 * sec, hits: 1, cd: true, ok: false, remaining: 0, reset: 40 * sec, retry: 50 * sec},
		// As many entries as the limit: the hits go into the newest entry,
		// which takes their instant.
		{at: 30 * sec, hits: 1, cd: true, ok: false, remaining: 0, reset: 30 * sec, retry: 40 * sec},
		{at: 61 * sec, hits: 0, ok: false, remaining: 0, reset: 9 * sec, retry: 9 * sec},
		{at: 70 * sec, hits: 1, cd: true, ok: true, remaining: 0, reset: 20 * sec},
	}},
	{"TokenBucketCountDenied", Rule(engine.TokenBucket, 10, time.Second, 10), []step{
		{at: 0, hits: 10, cd: true, ok: true, remaining: 0, reset: sec},
		{at: 500 * ms, hits: 6, cd: true, ok: false, remaining: 0, reset: 1100 * ms, retry: 700 * ms, before: 5},
		{at: 1500 * ms, hits: 0, ok: true, remaining: 9, reset: 100 * ms},
	}},
	// Debt without end: a 1-per-hour bucket charged MaxHits denied hits
	// again and again. The TAT stops at MaxBucketAhead ahead of now (it
	// wrapped round past 2^63 µs to a full bucket): denied throughout.
	{"TokenBucketDebtBounded", Rule(engine.TokenBucket, 1, time.Hour, 1), []step{
		{at: 0, hits: engine.MaxHits, cd: true, ok: false, remaining: 0, reset: engine.MaxBucketAhead * us, never: true, before: 1},
		{at: sec, hits: engine.MaxHits, cd: true, ok: false, remaining: 0, reset: engine.MaxBucketAhead * us, never: true},
		{at: 2 * sec, hits: 1, ok: false, remaining: 0, reset: engine.MaxBucketAhead*us - sec, retry: engine.MaxBucketAhead*us - sec},
	}},
	// Calendar windows (calendar: true): a month from the 1st, as long as
	// it is; a leap year's February; a DST day of 23 hours; an ISO week from
	// Monday; a year.
	{"CalendarMonth", CalendarRule(engine.Month, 3, time.UTC), []step{
		{at: 0, hits: 3, ok: true, remaining: 0, reset: since(time.UTC, 2027, 2, 1, 0, 0)},
		{at: since(time.UTC, 2027, 2, 1, 0, 0) - us, hits: 1, ok: false, remaining: 0, reset: us, retry: us},
		{at: since(time.UTC, 2027, 2, 1, 0, 0), hits: 1, ok: true, remaining: 2, reset: 28 * 24 * time.Hour},
		{at: since(time.UTC, 2028, 2, 10, 12, 0), hits: 1, ok: true, remaining: 2, reset: 19*24*time.Hour + 12*time.Hour}, // to March 1: 29 days in February 2028
	}},
	{"CalendarDayDST", CalendarRule(engine.Day, 1, paris), []step{
		// 2027-03-28, Paris: 02:00 becomes 03:00; the day lasts 23 hours.
		{at: since(paris, 2027, 3, 28, 0, 30), hits: 1, ok: true, remaining: 0, reset: 22*time.Hour + 30*time.Minute},
		{at: since(paris, 2027, 3, 28, 23, 59), hits: 1, ok: false, remaining: 0, reset: time.Minute, retry: time.Minute},
		{at: since(paris, 2027, 3, 29, 0, 0), hits: 1, ok: true, remaining: 0, reset: 24 * time.Hour},
	}},
	{"CalendarWeek", CalendarRule(engine.Week, 2, time.UTC), []step{
		{at: 0, hits: 2, ok: true, remaining: 0, reset: since(time.UTC, 2027, 1, 18, 0, 0)}, // Friday to Monday
		{at: since(time.UTC, 2027, 1, 17, 23, 0), hits: 1, ok: false, remaining: 0, reset: time.Hour, retry: time.Hour},
		{at: since(time.UTC, 2027, 1, 18, 0, 0), hits: 1, ok: true, remaining: 1, reset: 7 * 24 * time.Hour},
	}},
	{"CalendarYear", CalendarRule(engine.Year, 1, paris), []step{
		{at: 0, hits: 1, ok: true, remaining: 0, reset: since(paris, 2028, 1, 1, 0, 0)},
		{at: since(paris, 2028, 1, 1, 0, 0), hits: 1, ok: true, remaining: 0, reset: 366 * 24 * time.Hour},
	}},
	// 10 per second (one token per 100ms), capacity 20.
	{"TokenBucket", Rule(engine.TokenBucket, 10, time.Second, 20), []step{
		{at: 0, hits: 20, ok: true, remaining: 0, reset: 2 * sec},
		{at: 0, hits: 1, ok: false, remaining: 0, reset: 2 * sec, retry: 100 * ms},
		{at: 100 * ms, hits: 1, ok: true, remaining: 0, reset: 2 * sec},
		{at: 1100 * ms, hits: 0, ok: true, remaining: 10, reset: sec},
		{at: 1100 * ms, hits: 21, ok: false, remaining: 10, reset: sec, never: true}, // 21 > the burst of 20
		{at: 1100 * ms, hits: 11, ok: false, remaining: 10, reset: sec, retry: 100 * ms},
		{at: 1100 * ms, hits: 5, refund: true, ok: true, remaining: 15, reset: 500 * ms},
		{at: 1100 * ms, hits: 500, refund: true, ok: true, remaining: 20, reset: 0},
		{at: 10 * sec, hits: 20, ok: true, remaining: 0, reset: 2 * sec},
	}},
	// 3 per second: the interval is ceil(1s/3) = 333334µs.
	{"TokenBucketRoundsIntervalUp", Rule(engine.TokenBucket, 3, time.Second, 1), []step{
		{at: 0, hits: 1, ok: true, remaining: 0, reset: 333334 * us},
		{at: 333333 * us, hits: 1, ok: false, remaining: 0, reset: us, retry: us},
		{at: 333334 * us, hits: 1, ok: true, remaining: 0, reset: 333334 * us},
	}},
	{"TokenBucketZeroLimit", Rule(engine.TokenBucket, 0, time.Second, 0), []step{
		{at: 0, hits: 1, ok: false, remaining: 0, reset: 0, never: true},
		{at: 0, hits: 0, ok: true, remaining: 0, reset: 0},
	}},
}

func testTimeline(t *testing.T, newStore NewStore, tl timeline) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	items := []engine.Item{{Desc: uniqueDesc(t, "k=v"), Rule: tl.limit}}
	results := make([]engine.Result, 1)
	for i, st := range tl.steps {
		clock.Set(T0.Add(st.at))
		items[0].Hits, items[0].Refund, items[0].CountDenied = st.hits, st.refund, st.cd
		call := fmt.Sprintf("step %d: Apply(%s %d/%s burst %d, T0%+v, hits=%d, refund=%v, count denied=%v)", i, tl.limit.Algorithm(), tl.limit.Limit, tl.limit.Window, tl.limit.Burst, st.at, st.hits, st.refund, st.cd)
		ok, err := s.Apply(context.Background(), items, results)
		if err != nil {
			t.Fatalf("%s: %v", call, err)
		}
		r := results[0]
		if ok != st.ok || r.Admitted != st.ok {
			t.Fatalf("%s = %v (item %v), want %v", call, ok, r.Admitted, st.ok)
		}
		if r.Cached {
			// A denial cache may answer with what it knew: never a later
			// retry or reset, never more remaining than the truth.
			if r.RetryAfter > st.retry || r.Reset > st.reset || r.Remaining > st.remaining {
				t.Errorf("%s from the denial cache = %+v, want retry ≤ %s, reset ≤ %s, remaining ≤ %d", call, r, st.retry, st.reset, st.remaining)
			}
			continue
		}
		if r.Remaining != st.remaining {
			t.Errorf("%s remaining = %d, want %d", call, r.Remaining, st.remaining)
		}
		if r.Reset != st.reset {
			t.Errorf("%s reset = %s, want %s", call, r.Reset, st.reset)
		}
		if !st.ok && r.RetryAfter != st.retry {
			t.Errorf("%s retry after = %s, want %s", call, r.RetryAfter, st.retry)
		}
		if r.Never != st.never {
			t.Errorf("%s never = %v, want %v", call, r.Never, st.never)
		}
		if r.Blocked != st.blocked {
			t.Errorf("%s blocked = %v, want %v", call, r.Blocked, st.blocked)
		}
		if r.RemainingBeforeCharge != st.before {
			t.Errorf("%s remaining before the charge = %d, want %d", call, r.RemainingBeforeCharge, st.before)
		}
	}
}

// uniqueDesc returns a descriptor identity of its own for each test, so that
// stores shared between tests (one Redis) do not mix counters.
func uniqueDesc(t *testing.T, rest string) string {
	return fmt.Sprintf("%s-%d/%s", t.Name(), time.Now().UnixNano(), rest)
}

func apply(t *testing.T, s engine.Store, items []engine.Item) (bool, []engine.Result) {
	t.Helper()
	results := make([]engine.Result, len(items))
	ok, err := s.Apply(context.Background(), items, results)
	if err != nil {
		t.Fatalf("Apply(%d items): %v", len(items), err)
	}
	return ok, results
}

// testHugeHits: the most hits a request may carry (engine.MaxHits) are
// judged without arithmetic that could wrap (the reference sent hits of 2^63
// as a negative INCRBY): consumed whole where the limit is that large, else
// denied with nothing consumed; and given back.
func testHugeHits(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	century := 100 * 365 * 24 * time.Hour
	for _, tc := range []struct {
		limit *engine.Rule
		ok    bool
	}{
		{Rule(engine.FixedWindow, math.MaxUint32, century, 0), true},
		{Rule(engine.SlidingWindow, math.MaxUint32, century, 0), true},
		{Rule(engine.FixedWindow, 10, time.Minute, 0), false},
		{Rule(engine.SlidingWindow, 10, time.Minute, 0), false},
		{Rule(engine.SlidingLog, 100_000, time.Hour, 0), false},
		{Rule(engine.TokenBucket, 1_000_000, time.Second, 1_000_000), false},
	} {
		l := tc.limit
		item := engine.Item{Desc: uniqueDesc(t, "k=v"), Rule: l, Hits: engine.MaxHits}
		ok, res := apply(t, s, []engine.Item{item})
		want := uint64(l.Limit)
		if tc.ok {
			want = 0
		}
		if ok != tc.ok || res[0].Remaining != want {
			t.Errorf("%s %d/%s: Apply(hits=%d) = %v remaining %d, want %v remaining %d", l.Algorithm(), l.Limit, l.Window, item.Hits, ok, res[0].Remaining, tc.ok, want)
		}
		if !tc.ok && !res[0].Cached && (!res[0].Never || res[0].RetryAfter != 0) {
			t.Errorf("%s %d/%s: Apply(hits=%d) = %+v, want Never with no RetryAfter: more hits than the limit never pass", l.Algorithm(), l.Limit, l.Window, item.Hits, res[0])
		}
		item.Refund = true
		ok, res = apply(t, s, []engine.Item{item})
		if !ok || res[0].Remaining != uint64(l.Limit) {
			t.Errorf("%s %d/%s: refund of %d = %v remaining %d, want true remaining %d", l.Algorithm(), l.Limit, l.Window, item.Hits, ok, res[0].Remaining, l.Limit)
		}
	}
}

// testDeniedRestores: a denied request leaves every counter exactly as it
// was, even one that the request both refunded and consumed from.
func testDeniedRestores(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	never := Rule(engine.FixedWindow, 0, time.Minute, 0)
	for _, l := range []*engine.Rule{
		Rule(engine.FixedWindow, 5, time.Minute, 0),
		Rule(engine.SlidingWindow, 5, time.Minute, 0),
		Rule(engine.SlidingLog, 5, time.Minute, 0),
		Rule(engine.TokenBucket, 5, time.Minute, 5),
	} {
		desc := uniqueDesc(t, "k=v")
		for i := range 3 {
			clock.Set(T0.Add(time.Duration(i) * sec))
			if ok, _ := apply(t, s, []engine.Item{{Desc: desc, Rule: l, Hits: 1}}); !ok {
				t.Fatalf("%s: setup hit %d denied", l.Algorithm(), i)
			}
		}
		clock.Set(T0.Add(3 * sec))
		look := []engine.Item{{Desc: desc, Rule: l}}
		_, before := apply(t, s, look)
		ok, _ := apply(t, s, []engine.Item{
			{Desc: desc, Rule: l, Hits: 2, Refund: true},
			{Desc: desc, Rule: l, Hits: 4},
			{Desc: uniqueDesc(t, "other=x"), Rule: never, Hits: 1},
		})
		if ok {
			t.Fatalf("%s: a request with a limit of 0 admitted", l.Algorithm())
		}
		if _, after := apply(t, s, look); after[0] != before[0] {
			t.Errorf("%s: a look after a denied request = %+v, before it %+v: the denied request changed the counter", l.Algorithm(), after[0], before[0])
		}
	}
}

func testAllOrNothingWindows(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	desc := uniqueDesc(t, "ip=1")
	perSecond := Rule(engine.FixedWindow, 3, time.Second, 0)
	perMinute := Rule(engine.SlidingWindow, 5, time.Minute, 0)
	perHour := Rule(engine.TokenBucket, 100, time.Hour, 100)
	steps := []struct {
		at        time.Duration
		hits      uint64
		ok        bool
		remaining [3]uint64
	}{
		{0, 2, true, [3]uint64{1, 3, 98}},
		{0, 2, false, [3]uint64{1, 3, 98}}, // the second denies: nothing is consumed
		{0, 1, true, [3]uint64{0, 2, 97}},
		{sec, 2, true, [3]uint64{1, 0, 95}},
		{2 * sec, 1, false, [3]uint64{3, 0, 95}}, // the minute denies
	}
	for i, st := range steps {
		clock.Set(T0.Add(st.at))
		ok, res := apply(t, s, []engine.Item{
			{Desc: desc, Rule: perSecond, Hits: st.hits},
			{Desc: desc, Rule: perMinute, Hits: st.hits},
			{Desc: desc, Rule: perHour, Hits: st.hits},
		})
		got := [3]uint64{res[0].Remaining, res[1].Remaining, res[2].Remaining}
		if ok != st.ok || got != st.remaining {
			t.Fatalf("step %d: Apply(3 windows, T0+%s, hits=%d) = %v remaining %v, want %v %v", i, st.at, st.hits, ok, got, st.ok, st.remaining)
		}
	}
}

func testAllOrNothingDescriptors(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	l := Rule(engine.FixedWindow, 2, time.Minute, 0)
	a, b := uniqueDesc(t, "user=a"), uniqueDesc(t, "user=b")
	if ok, _ := apply(t, s, []engine.Item{{Desc: b, Rule: l, Hits: 2}}); !ok {
		t.Fatal("setup: user b's first 2 hits denied")
	}
	for i := range 3 {
		ok, res := apply(t, s, []engine.Item{{Desc: a, Rule: l, Hits: 1}, {Desc: b, Rule: l, Hits: 1}})
		if res[0].Cached {
			t.Fatalf("request %d: a's status came from a denial cache, but a was never denied", i)
		}
		if ok || !res[0].Admitted || res[1].Admitted || res[0].Remaining != 2 {
			t.Fatalf("request %d: Apply(a, b) = %v (a %v remaining %d, b %v), want false (true remaining 2, false): a denied request must consume nothing",
				i, ok, res[0].Admitted, res[0].Remaining, res[1].Admitted)
		}
		if res[1].RetryAfter != 60*sec && !res[1].Cached {
			t.Errorf("request %d: b retry after = %s, want 1m", i, res[1].RetryAfter)
		}
	}
	if ok, res := apply(t, s, []engine.Item{{Desc: a, Rule: l, Hits: 2}}); !ok || res[0].Remaining != 0 {
		t.Fatalf("Apply(a, hits=2) after denials = %v remaining %d, want true 0", ok, res[0].Remaining)
	}
}

func testShadow(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	desc := uniqueDesc(t, "k=v")
	enforced := Rule(engine.FixedWindow, 10, time.Minute, 0)
	shadow := Rule(engine.FixedWindow, 1, time.Second, 0)
	for i, want := range []struct {
		shadowOK  bool
		remaining uint64
	}{{true, 9}, {false, 8}, {false, 7}} {
		ok, res := apply(t, s, []engine.Item{{Desc: desc, Rule: enforced, Hits: 1}, {Desc: desc, Rule: shadow, Hits: 1, Shadow: true}})
		if !ok || res[1].Admitted != want.shadowOK || res[0].Remaining != want.remaining || res[1].Remaining != 0 {
			t.Fatalf("step %d: Apply(enforced, shadow) = %v (shadow %v remaining %d, enforced remaining %d), want true (%v, 0, %d)",
				i, ok, res[1].Admitted, res[1].Remaining, res[0].Remaining, want.shadowOK, want.remaining)
		}
	}
}

func testQuota(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	one := Rule(engine.FixedWindow, 1, time.Minute, 0)
	plain := Rule(engine.SlidingWindow, 100, time.Minute, 0)
	qa, qb, qc, ip := uniqueDesc(t, "quota=a"), uniqueDesc(t, "quota=b"), uniqueDesc(t, "quota=c"), uniqueDesc(t, "ip=1")
	req := []engine.Item{
		{Desc: qa, Rule: one, Hits: 1, Group: 1},
		{Desc: qa, Rule: plain, Hits: 1, Group: 1},
		{Desc: qb, Rule: one, Hits: 1, Group: 2},
		{Desc: ip, Rule: plain, Hits: 1},
	}
	ok, res := apply(t, s, req)
	if !ok || res[1].Remaining != 99 || res[2].Remaining != 0 || res[3].Remaining != 99 {
		t.Fatalf("request 1 = %v, remaining %d/%d/%d, want true, 99/0/99", ok, res[1].Remaining, res[2].Remaining, res[3].Remaining)
	}
	ok, res = apply(t, s, req)
	if ok || res[3].Remaining != 99 || res[1].Remaining != 99 {
		t.Fatalf("request 2 (both quotas over) = %v, remaining ip %d, a-plain %d, want false, 99, 99", ok, res[3].Remaining, res[1].Remaining)
	}
	req = append(req, engine.Item{Desc: qc, Rule: one, Hits: 1, Group: 3})
	ok, res = apply(t, s, req)
	if !ok || res[0].Admitted || !res[1].Admitted || res[1].Remaining != 99 || res[3].Remaining != 98 || res[4].Remaining != 0 {
		t.Fatalf("request 3 (quota c has room) = %v, a (%v, plain %v remaining %d), ip remaining %d, c remaining %d; want true, a (false, plain true remaining 99), 98, 0",
			ok, res[0].Admitted, res[1].Admitted, res[1].Remaining, res[3].Remaining, res[4].Remaining)
	}
}

func testSameCounterTwice(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	item := engine.Item{Desc: uniqueDesc(t, "k=v"), Rule: Rule(engine.FixedWindow, 3, time.Minute, 0), Hits: 2}
	ok, res := apply(t, s, []engine.Item{item, item})
	if ok || !res[0].Admitted || res[1].Admitted || res[0].Remaining != 3 {
		t.Fatalf("Apply(2+2 on a limit of 3) = %v (%v, %v) remaining %d, want false (true, false) 3", ok, res[0].Admitted, res[1].Admitted, res[0].Remaining)
	}
	item.Hits = 1
	ok, res = apply(t, s, []engine.Item{item, item})
	if !ok || res[0].Remaining != 1 || res[1].Remaining != 1 {
		t.Fatalf("Apply(1+1 on a limit of 3) = %v remaining (%d, %d), want true (1, 1)", ok, res[0].Remaining, res[1].Remaining)
	}
}

// testPeek replays a seeded random sequence of requests (every algorithm,
// shared counters, refunds, shadow and quota items, steps of the clock)
// and, before each, Peeks at it: Peek's verdicts are Apply's, its
// remaining and reset are those of a look (hits 0) just before, and a look
// after the Peek finds the state as it was.
func testPeek(t *testing.T, newStore NewStore) {
	seed := Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	var rules []*engine.Rule
	for _, alg := range Algorithms() {
		rules = append(rules, Rule(alg, 5, 10*time.Second, 5), Rule(alg, 3, time.Minute, 4))
	}
	for _, l := range rules {
		l.ID = WindowID(l)
	}
	rules = append(rules, CalendarRule(engine.Day, 4, time.UTC))
	descs := []string{uniqueDesc(t, "a=1"), uniqueDesc(t, "b=2")}
	for step := range 300 {
		var items []engine.Item
		for range 1 + rng.IntN(4) {
			it := engine.Item{Desc: descs[rng.IntN(len(descs))], Rule: rules[rng.IntN(len(rules))], Hits: uint64(rng.IntN(4))}
			switch rng.IntN(8) {
			case 0:
				it.Refund = true
			case 1:
				it.Shadow = true
			case 2:
				it.Group = int32(1 + rng.IntN(2))
			}
			items = append(items, it)
		}
		look := make([]engine.Item, len(items))
		for i, it := range items {
			look[i] = engine.Item{Desc: it.Desc, Rule: it.Rule}
		}
		_, before := apply(t, s, look)
		peek := make([]engine.Result, len(items))
		peeked, err := s.Peek(context.Background(), items, peek)
		if err != nil {
			t.Fatalf("seed %d step %d: Peek: %v", seed, step, err)
		}
		_, after := apply(t, s, look)
		ok, res := apply(t, s, items)
		for i := range items {
			p, b, a, r := peek[i], before[i], after[i], res[i]
			if p.Remaining != b.Remaining || p.Reset != b.Reset || a.Remaining != b.Remaining || a.Reset != b.Reset {
				t.Fatalf("seed %d step %d item %d (%s %s hits %d): look before %d/%v, Peek %d/%v, look after %d/%v: want all equal",
					seed, step, i, items[i].Desc, items[i].Rule.ID, items[i].Hits, b.Remaining, b.Reset, p.Remaining, p.Reset, a.Remaining, a.Reset)
			}
			if p.Admitted != r.Admitted || !r.Admitted && (p.Never != r.Never || p.RetryAfter != r.RetryAfter) {
				t.Fatalf("seed %d step %d item %d (%s %s hits %d): Peek %+v, Apply %+v: want the same verdict", seed, step, i, items[i].Desc, items[i].Rule.ID, items[i].Hits, p, r)
			}
		}
		if peeked != ok {
			t.Fatalf("seed %d step %d: Peek says %v, Apply %v", seed, step, peeked, ok)
		}
		clock.Set(clock.Now().Add(time.Duration(rng.IntN(4000)) * time.Millisecond))
	}
}

// testCountDeniedPassesAfterItsCharge: a count-denied item denied only by
// the hits an earlier item of its request took tentatively from the same
// counter is charged once the request is denied, and could then pass at
// once: its retry is now, not the window's end (a sliding window with no
// previous window divided 0 by 0 in its retry, which Lua read as the end).
func testCountDeniedPassesAfterItsCharge(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	for _, alg := range []string{engine.FixedWindow, engine.SlidingWindow, engine.SlidingLog} {
		desc := uniqueDesc(t, "k="+alg)
		ok, res := apply(t, s, []engine.Item{
			{Desc: desc, Rule: Rule(alg, 10, time.Minute, 0), Hits: 3},
			{Desc: desc, Rule: Rule(alg, 3, time.Minute, 0), Hits: 1, CountDenied: true},
		})
		if ok || !res[0].Admitted || res[1].Admitted {
			t.Fatalf("%s: Apply(3 of 10, then 1 of 3 count denied, one counter) = %v (%v, %v), want false (true, false)", alg, ok, res[0].Admitted, res[1].Admitted)
		}
		if r := res[1]; r.Cached || r.Never || r.RetryAfter > time.Microsecond || r.Remaining != 2 {
			t.Errorf("%s: the count-denied item after its charge = %+v, want remaining 2 and a retry of at most 1µs", alg, r)
		}
	}
}

// testCountDeniedRemainingBeforeCharge: a denied count-denied item says
// what remained just before its hits were charged (envoyproxy/ratelimit's
// stats split a denial by it: from 8 to 12 on a limit of 10 is 2 near and 2
// over), after the charges of the items before it in the request, as
// Remaining is read after its own; every other item says 0.
func testCountDeniedRemainingBeforeCharge(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	limits := []*engine.Rule{CalendarRule(engine.Day, 10, time.UTC)}
	for _, alg := range Algorithms() {
		limits = append(limits, Rule(alg, 10, time.Minute, 10))
	}
	for _, l := range limits {
		name := l.Algorithm()
		if l.Calendar != nil {
			name = "calendar"
		}
		desc, other := uniqueDesc(t, "k="+name), uniqueDesc(t, "other="+name)
		type want struct {
			ok             bool
			before, remain uint64
		}
		for i, st := range []struct {
			items []engine.Item
			ok    bool
			want  []want
		}{
			{[]engine.Item{{Desc: desc, Rule: l, Hits: 8, CountDenied: true}}, true, []want{{true, 0, 2}}},
			// 1 then 4 of the same counter: the 1 admits when judged, the 4
			// does not; denied, the 1 is charged (9), then the 4 (from 1).
			// A shadow count-denied item on another counter, denied: charged
			// from 0 into debt. A plain item: nothing.
			{[]engine.Item{
				{Desc: desc, Rule: l, Hits: 1, CountDenied: true},
				{Desc: desc, Rule: l, Hits: 4, CountDenied: true},
				{Desc: other, Rule: l, Hits: 11, CountDenied: true, Shadow: true},
				{Desc: other, Rule: l, Hits: 1},
			}, false, []want{{true, 0, 0}, {false, 1, 0}, {false, 10, 0}, {true, 0, 0}}},
			// In debt: nothing remained.
			{[]engine.Item{{Desc: desc, Rule: l, Hits: 2, CountDenied: true}}, false, []want{{false, 0, 0}}},
		} {
			ok, res := apply(t, s, st.items)
			if ok != st.ok {
				t.Fatalf("%s step %d: Apply = %v, want %v", name, i, ok, st.ok)
			}
			for j, w := range st.want {
				r := res[j]
				if r.Cached {
					continue // a denial cache's answer (not for count-denied items)
				}
				if r.Admitted != w.ok || r.RemainingBeforeCharge != w.before || r.Remaining != w.remain {
					t.Errorf("%s step %d item %d (hits %d, count denied %v, shadow %v): admitted %v, remaining before the charge %d, remaining %d; want %v, %d, %d",
						name, i, j, st.items[j].Hits, st.items[j].CountDenied, st.items[j].Shadow, r.Admitted, r.RemainingBeforeCharge, r.Remaining, w.ok, w.before, w.remain)
				}
			}
		}
	}
}

func testSeparate(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	desc := uniqueDesc(t, "k=v")
	minute := Rule(engine.FixedWindow, 1, time.Minute, 0)
	hour := Rule(engine.FixedWindow, 1, time.Hour, 0)
	named := Rule(engine.FixedWindow, 1, time.Minute, 0)
	named.ID += ":5:other"
	for i, it := range []engine.Item{
		{Desc: desc, Rule: minute, Hits: 1},
		{Desc: desc, Rule: hour, Hits: 1},
		{Desc: desc, Rule: named, Hits: 1},
		{Desc: desc + "x", Rule: minute, Hits: 1},
	} {
		if ok, _ := apply(t, s, []engine.Item{it}); !ok {
			t.Errorf("item %d (%s %s) denied: it must have its own counter", i, it.Desc, it.Rule.ID)
		}
	}
}

func testExpired(t *testing.T, newStore NewStore) {
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	desc := uniqueDesc(t, "k=v")
	limits := []*engine.Rule{
		Rule(engine.FixedWindow, 2, time.Second, 0),
		Rule(engine.SlidingWindow, 2, time.Second, 0),
		Rule(engine.SlidingLog, 2, time.Second, 0),
		Rule(engine.TokenBucket, 2, time.Second, 2),
	}
	for _, l := range limits {
		if ok, _ := apply(t, s, []engine.Item{{Desc: desc, Rule: l, Hits: 2}}); !ok {
			t.Fatalf("%s: first 2 hits denied", l.Algorithm())
		}
	}
	clock.Set(T0.Add(10 * sec))
	for _, l := range limits {
		ok, res := apply(t, s, []engine.Item{{Desc: desc, Rule: l, Hits: 0}})
		if !ok || res[0].Remaining != 2 {
			t.Errorf("%s: 10s later, remaining = %d (admitted %v), want 2", l.Algorithm(), res[0].Remaining, ok)
		}
	}
}

func testCancelled(t *testing.T, newStore NewStore) {
	s := newStore(t, NewClock(T0).Now)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	items := []engine.Item{{Desc: uniqueDesc(t, "k=v"), Rule: Rule(engine.FixedWindow, 1, time.Second, 0), Hits: 1}}
	_, err := s.Apply(ctx, items, make([]engine.Result, 1))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Apply with a cancelled context = %v, want an error wrapping context.Canceled", err)
	}
}

// testNoItems: a request of no items is admitted (every item admits, as
// Evaluate reads it), peeks as admitted, and resets nothing: no store
// fails or panics on it.
func testNoItems(t *testing.T, newStore NewStore) {
	s := newStore(t, NewClock(T0).Now)
	ctx := context.Background()
	if ok, err := s.Apply(ctx, nil, nil); !ok || err != nil {
		t.Errorf("Apply(no items) = %v, %v; want admitted", ok, err)
	}
	if ok, err := s.Peek(ctx, nil, nil); !ok || err != nil {
		t.Errorf("Peek(no items) = %v, %v; want admitted", ok, err)
	}
	if n, err := s.Reset(ctx, nil); n != 0 || err != nil {
		t.Errorf("Reset(no items) = %d, %v; want 0", n, err)
	}
}

// testConcurrent: 64 goroutines on one limit admit exactly the limit.
func testConcurrent(t *testing.T, newStore NewStore) {
	s := newStore(t, NewClock(T0).Now)
	const workers, perWorker, max = 64, 20, 500
	desc := uniqueDesc(t, "k=v")
	limits := []*engine.Rule{
		Rule(engine.FixedWindow, max, time.Minute, 0),
		Rule(engine.SlidingLog, max, time.Minute, 0),
		Rule(engine.TokenBucket, max, time.Hour, max),
	}
	for _, l := range limits {
		var admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				items := []engine.Item{{Desc: desc, Rule: l, Hits: 1}}
				results := make([]engine.Result, 1)
				for range perWorker {
					ok, err := s.Apply(context.Background(), items, results)
					if err != nil {
						errs <- err
						return
					}
					if ok {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s: Apply: %v", l.Algorithm(), err)
		}
		if got := admitted.Load(); got != max {
			t.Errorf("%s: %d goroutines × %d requests admitted %d, want exactly %d", l.Algorithm(), workers, perWorker, got, max)
		}
	}
}
