package engine

import (
	"fmt"
	"strings"
	"time"
)

// Spec is a limit as a config or a request gives it, before it is
// compiled: plain values, no positions and no grammar. Compile checks it
// and builds the Rule that stores count with. An option that a config may
// leave out is an Opt: given or not, and its value.
type Spec struct {
	// Algorithm is an algorithm's name (AlgorithmNames), in any case; ""
	// is fixed_window.
	Algorithm string
	// Unit and Multiplier give the window: Multiplier × Unit (Multiplier
	// ≥ 1), at most 100 years.
	Unit       Unit
	Multiplier uint32
	// Limit is the hits admitted per window (requests_per_unit); 0 admits
	// nothing.
	Limit uint32
	// Burst is a token bucket's capacity (when not given, Limit).
	Burst Opt[uint32]
	// LeaseTTL is a concurrency limit's lease_ttl (no other algorithm
	// takes one): how long an acquisition that no release frees holds its
	// slot.
	LeaseTTL Opt[time.Duration]
	// Calendar makes a fixed window follow the calendar of TimeZone (an
	// IANA name; UTC when not given).
	Calendar bool
	TimeZone Opt[string]
	// Name, when set, is part of the counter's identity.
	Name string
	// Lease lets a store decide the limit from pre-paid slices of its
	// counter (Rule.Lease); only for the algorithms that allow it
	// (LeasableAlgorithms).
	Lease bool
	// Penalty is the ladder of blocks that the limit's denials earn
	// (penalty.go); PenaltyReset the quiet time after a block after which
	// the ladder starts over (when not given, DefaultPenaltyReset).
	Penalty      []time.Duration
	PenaltyReset Opt[time.Duration]
}

// Opt is an option of a Spec that may be left out: Set says whether it
// was given (a config's key present, even with a value that is then
// refused), V is its value.
type Opt[T any] struct {
	V   T
	Set bool
}

// Some returns the Opt of a value given.
func Some[T any](v T) Opt[T] { return Opt[T]{V: v, Set: true} }

// String is o's value, or "-" when it was not given.
func (o Opt[T]) String() string {
	if !o.Set {
		return "-"
	}
	return fmt.Sprint(o.V)
}

// Or returns o's value when it was given, def otherwise.
func (o Opt[T]) Or(def T) T {
	if o.Set {
		return o.V
	}
	return def
}

// SpecError is a problem of one field of a Spec: Field is its config name
// ("burst", "time_zone", ...), Key whether the problem is the field's
// presence (its key) rather than its value.
type SpecError struct {
	Field string
	Key   bool
	Msg   string
}

func (e SpecError) Error() string { return e.Field + ": " + e.Msg }

// specErrors collects the problems of a Spec.
type specErrors []SpecError

func (errs *specErrors) add(field string, key bool, format string, args ...any) {
	*errs = append(*errs, SpecError{Field: field, Key: key, Msg: fmt.Sprintf(format, args...)})
}

// Bounds that keep the engines' arithmetic safe.
const (
	// MaxWindow is the longest window, Multiplier × Unit.
	MaxWindow = 100 * 365 * 24 * time.Hour
	// maxTokenSpan bounds burst × emission interval of a token bucket, in
	// microseconds: the bucket's span stays exact in a float64 (Lua
	// numbers).
	maxTokenSpan = 1 << 53
	// MaxSlidingLog bounds the limit of a sliding log, which keeps an entry
	// per consumption.
	MaxSlidingLog = 100000
)

// Rule is a compiled limit: how one counter counts (its algorithm, window,
// limit and burst) and which counter it is among the rules of a descriptor
// (ID). Stores see only rules, never the config they came from. Built by
// Compile; immutable and safe for concurrent use once built.
type Rule struct {
	alg algorithm
	// Unit and Multiplier give the window, Window = Multiplier × Unit. A
	// calendar rule's Window is its unit's nominal length, for display
	// only: its windows are as long as the calendar makes them. A
	// concurrency rule's Window is its lease_ttl (its unit means nothing).
	Unit       Unit
	Multiplier uint32
	Window     time.Duration
	// Limit is the hits admitted per window (0 admits nothing). At most
	// MaxSlidingLog for a sliding log; for a token bucket at most one per
	// microsecond of the window.
	Limit uint32
	// Burst is a token bucket's capacity; 0 for the other algorithms.
	// Burst × the emission interval (Window / Limit, rounded up to a whole
	// microsecond) is at most 2^53 µs.
	Burst uint32
	// Calendar, when not nil, makes this fixed window follow the calendar
	// of that time zone: a day from local midnight, an ISO week from
	// Monday, a month from the 1st, a year from January 1.
	Calendar *time.Location
	// ID is the counter's identity among the rules of one descriptor: the
	// algorithm's code and the window in seconds, then the length-prefixed
	// name when there is one ("fw60s", "tb1s:5:burst"); a calendar rule's
	// is its unit and zone ("cal.month@Europe/Paris"), a concurrency
	// rule's "cc" and its name (no lease_ttl). Stable while
	// algorithm, window and name are; it contains no '{' or '}' outside the
	// name part. See key.go.
	ID string
	// Lease: a store that shares counters between processes may take a
	// pre-paid slice of this limit's counter (hits counted in the store
	// when taken) and decide from it in process, never admitting more than
	// the limit (internal/lease). It is not part of the counter's
	// identity: leased and unleased rules of the same limit share one
	// counter. Only for algorithms whose hits a slice can hold (fixed and
	// calendar windows, token buckets).
	Lease bool
	// Penalty, when not empty, blocks the counter after each denial by
	// its limit for the next duration of the ladder (the last one again
	// once the ladder is climbed); PenaltyReset is how long after a block's
	// end without a denial the ladder starts over. Not part of the
	// counter's identity. See penalty.go.
	Penalty      []time.Duration
	PenaltyReset time.Duration

	// spec is what the rule was compiled from (WithLimit compiles it again
	// with another limit).
	spec Spec
}

// Compile checks s and builds its rule. On problems it returns them all
// (the rule is then nil): each algorithm checks what is its own (key for
// key as a config would say it).
func Compile(s Spec) (*Rule, []SpecError) {
	var errs specErrors
	alg := algorithmNamed(s.Algorithm)
	if alg == nil {
		errs.add("algorithm", false, "algorithm %q is not one of %s", s.Algorithm, AlgorithmNames())
		return nil, errs
	}
	if s.Multiplier == 0 {
		errs.add("unit_multiplier", false, "unit_multiplier must be at least 1")
		return nil, errs
	}
	if s.Unit == UnitUnknown || s.Unit.Duration() == 0 {
		errs.add("unit", false, "unit is required (one of %s)", UnitNames())
		return nil, errs
	}
	if time.Duration(s.Multiplier) > MaxWindow/s.Unit.Duration() {
		field := "unit"
		if s.Multiplier != 1 {
			field = "unit_multiplier"
		}
		errs.add(field, false, "window %d × %s is longer than 100 years", s.Multiplier, s.Unit)
		return nil, errs
	}
	r := &Rule{alg: alg, Unit: s.Unit, Multiplier: s.Multiplier, Window: time.Duration(s.Multiplier) * s.Unit.Duration(), Limit: s.Limit}
	if s.TimeZone.Set && !s.Calendar {
		errs.add("time_zone", true, "time_zone is only for calendar: true limits")
	}
	noLeaseTTL(&s, alg, &errs)
	r.alg = alg.compile(&s, r, &errs)
	if s.Calendar {
		r.alg = compileCalendar(&s, r, &errs)
	}
	if s.Lease && !r.alg.leasable() {
		errs.add("lease", true, "lease: true is for algorithms %s; not %s, whose counter a slice cannot be taken from",
			LeasableAlgorithms(), r.alg.name())
	}
	r.Lease = s.Lease
	compilePenalty(&s, r, &errs)
	if len(errs) > 0 {
		return nil, errs
	}
	r.ID = r.alg.counterID(r) + nameSuffix(s.Name)
	r.spec = s
	return r, nil
}

// WithLimit returns r with another limit (requests_per_unit) and, for a
// rule with a burst (HasBurst), another burst (when not given, limit, as
// a Spec's), checked as Compile checks them: a runtime override of a
// configured limit. Everything else is r's, the counter's identity (ID)
// above all, so that a counter counted under r goes on under the result:
// neither the limit nor the burst is part of it. A burst given to a rule
// without one is a problem (field "burst").
func (r *Rule) WithLimit(limit uint32, burst Opt[uint32]) (*Rule, []SpecError) {
	s := r.spec
	s.Limit, s.Burst = limit, burst
	nr, errs := Compile(s)
	if len(errs) > 0 {
		return nil, errs
	}
	if nr.ID != r.ID {
		panic(fmt.Sprintf("engine: WithLimit changed the counter identity %q to %q", r.ID, nr.ID))
	}
	return nr, nil
}

// MustCompile is Compile for specs known to be valid (tests, built-in
// rules); it panics on a problem.
func MustCompile(s Spec) *Rule {
	r, errs := Compile(s)
	if len(errs) > 0 {
		panic(fmt.Sprintf("engine.MustCompile(%+v): %v", s, errs))
	}
	return r
}

// Algorithm returns the name of the rule's algorithm as configs write it
// ("fixed_window" for a calendar window too).
func (r *Rule) Algorithm() string { return configName(r.alg) }

// Code is the rule's algorithm code: a calendar window has its own.
// Stores that send rules over a wire (the Redis scripts) use it; the codes
// are stable (algorithms below).
func (r *Rule) Code() uint8 { return r.alg.code() }

// Capacity is the most hits the rule can ever admit at once: its limit, or
// a token bucket's burst (none when it refills nothing). More hits are
// denied whatever the wait (Result.Never).
func (r *Rule) Capacity() uint64 { return r.alg.capacity(r) }

// QuotaWindow is the window over which the rule's capacity is advertised
// (X-RateLimit-Limit, RateLimit-Policy), for an answer whose reset is at
// end: its window, or for a token bucket the time its empty bucket takes
// to fill (burst × window ÷ limit, rounded up to whole seconds, so that the
// advertised rate is never more than the limit's), or for a calendar
// window the length of the calendar window that ends at end (29 days for
// February 2024). Remaining is never more than the capacity.
func (r *Rule) QuotaWindow(end time.Time) time.Duration { return r.alg.quotaWindow(r, end) }

// Expiry returns the instant from which st is equivalent to the zero State
// under r: a store may forget it then. 0 means it already is.
func (r *Rule) Expiry(st *State) int64 { return max(r.alg.expiry(r, st), r.penaltyExpiry(st)) }

// DenialCoversMoreHits reports whether a denial of some hits under r until
// an instant is a denial of more hits until the same instant, with the same
// status: true for windows whose retry instant is the window's end
// whatever the hits (fixed and calendar windows). A denial cache may answer
// requests of more hits from such a denial.
func (r *Rule) DenialCoversMoreHits() bool { return r.alg.denialCoversMoreHits() }

// StateSizeVaries reports whether the memory a counter's state takes
// changes with what it counts (a sliding log's entries); stores that
// account memory measure such a state again after each change.
func (r *Rule) StateSizeVaries() bool { return r.alg.stateSizeVaries() }

// Refills reports whether r's counter refills continuously (a token
// bucket) rather than window by window: it has no window end, so hits
// given back count whenever they land, and its reset is the instant it is
// full again.
func (r *Rule) Refills() bool { return r.alg.refills() }

// HasBurst reports whether r has a burst (Burst, even 0): the capacity of
// a counter that refills.
func (r *Rule) HasBurst() bool { return r.alg.refills() }

// InFlight reports whether r limits requests in flight rather than a rate
// (algorithm concurrency): hits acquire slots and refunds release them,
// its Window is the lease_ttl and its Unit means nothing.
func (r *Rule) InFlight() bool { return r.alg.inFlight() }

// WindowInIdentity reports whether r's Window is part of its counter's
// identity (ID): false for a calendar window (its windows are the
// calendar's; the unit and zone are its identity) and for a limit in
// flight (its Window is its lease_ttl, which a reload may change without
// losing the acquisitions). Limits sharing a counter share their Window
// when it is.
func (r *Rule) WindowInIdentity() bool { return r.alg.windowInIdentity() }

// OwnKey reports whether a store that keeps counters under string keys
// keeps r's in a key of its own (its CounterKey: a sliding log's entries,
// a sorted set on Redis) rather than as a field of its descriptor's hash
// (DescriptorKey): the counters whose state size varies.
func (r *Rule) OwnKey() bool { return r.alg.stateSizeVaries() }

// DefaultAlgorithm reports whether r counts with the algorithm that a
// Spec naming none compiles to (a fixed window, calendar: true or not).
func (r *Rule) DefaultAlgorithm() bool { return configName(r.alg) == configName(algorithmNamed("")) }

// CalendarBounds returns, for a calendar rule, the starts of the windows
// before, at and after the one holding the instant at (µs), and the end of
// the last: what a store that decides at another clock (Redis's) needs to
// find the window holding its own instant. ok is false for a rule whose
// window is a length (Window).
func (r *Rule) CalendarBounds(at int64) (bounds [4]int64, ok bool) {
	return r.alg.calendarBounds(r, at)
}

// window returns the rule's window in microseconds (≥ 1 for a valid rule).
func (r *Rule) window() int64 { return r.Window.Microseconds() }

// LeasableAlgorithms names the algorithms that Spec.Lease allows, as
// configs write them.
func LeasableAlgorithms() string {
	var names []string
	for _, a := range algorithms {
		switch _, isForm := a.(form); {
		case isForm || !a.leasable():
		case a.name() == FixedWindow:
			names = append(names, FixedWindow+" (calendar: true too)")
		default:
			names = append(names, a.name())
		}
	}
	return strings.Join(names, " and ")
}

// AlgorithmNames returns the names a Spec may give, joined by "|".
func AlgorithmNames() string {
	var names []string
	for _, a := range algorithms {
		if _, ok := a.(form); !ok {
			names = append(names, a.name())
		}
	}
	return strings.Join(names, "|")
}

// IsAlgorithm reports whether name (any case) names an algorithm.
func IsAlgorithm(name string) bool { return name != "" && algorithmNamed(name) != nil }

// algorithmNamed returns the algorithm that configs call name (any case; ""
// is the fixed window), nil for none.
func algorithmNamed(name string) algorithm {
	if name == "" {
		return fixedWindow{}
	}
	for _, a := range algorithms {
		if _, isForm := a.(form); !isForm && strings.EqualFold(a.name(), name) {
			return a
		}
	}
	return nil
}
