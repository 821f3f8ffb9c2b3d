package descriptors

import (
	"strconv"
	"time"
)

// Unit is the time unit of a limit. The zero value is UnitUnknown, which no
// valid limit has. Month and year are fixed blocks of 30 and 365 days, as in
// Envoy and envoyproxy/ratelimit, not calendar units.
type Unit uint8

// Units in the order of their length.
const (
	UnitUnknown Unit = iota
	Second
	Minute
	Hour
	Day
	Week
	Month
	Year
)

var unitNames = [...]string{"unknown", "second", "minute", "hour", "day", "week", "month", "year"}

var unitDurations = [...]time.Duration{
	0,
	time.Second,
	time.Minute,
	time.Hour,
	24 * time.Hour,
	7 * 24 * time.Hour,
	30 * 24 * time.Hour,
	365 * 24 * time.Hour,
}

// String returns the lower-case name used in config files ("second", ...).
func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "unknown"
}

// Duration returns the length of one unit, or 0 for UnitUnknown.
func (u Unit) Duration() time.Duration {
	if int(u) < len(unitDurations) {
		return unitDurations[u]
	}
	return 0
}

// Algorithm is how a limit counts. The zero value is FixedWindow, the
// default of config files and the only algorithm of envoyproxy/ratelimit.
type Algorithm uint8

// The algorithms of DESIGN §4.3.
const (
	// FixedWindow counts hits per window; windows are aligned to the Unix epoch.
	FixedWindow Algorithm = iota
	// SlidingWindow weights the previous fixed window by the part of it that
	// still overlaps the sliding window (the Cloudflare estimate).
	SlidingWindow
	// SlidingLog keeps one timestamp per admitted hit: exact, memory grows
	// with the limit.
	SlidingLog
	// TokenBucket is GCRA: one timestamp per key, rate RequestsPerUnit per
	// window, capacity Burst.
	TokenBucket
)

var algorithmNames = [...]string{"fixed_window", "sliding_window", "sliding_log", "token_bucket"}

// algorithmCodes are the short forms used in counter identities (Limit.ID).
var algorithmCodes = [...]string{"fw", "sw", "sl", "tb"}

// CounterID is a limit's counter identity among the limits of its node
// (Limit.ID): the algorithm's code and the window in seconds, then the
// length-prefixed name when there is one ("fw60s", "tb1s:5:burst"). A
// request override counts in CounterID(FixedWindow, its window, ""), the
// counter of a configured unnamed fixed window of the same length.
func CounterID(alg Algorithm, window time.Duration, name string) string {
	return algorithmCodes[alg] + strconv.FormatInt(int64(window/time.Second), 10) + "s" + nameSuffix(name)
}

// CalendarCounterID is the counter identity of a calendar limit
// ("cal.month@Europe/Paris"): another counter than a fixed window of the
// same nominal length, and per time zone.
func CalendarCounterID(unit Unit, loc *time.Location, name string) string {
	return "cal." + unit.String() + "@" + loc.String() + nameSuffix(name)
}

// nameSuffix is the length-prefixed name part of a Limit.ID.
func nameSuffix(name string) string {
	if name == "" {
		return ""
	}
	return ":" + strconv.Itoa(len(name)) + ":" + name
}

// String returns the config name ("fixed_window", ...).
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return "unknown"
}

// Limit is one window of a descriptor (one element of rate_limits, or the
// rate_limit). A Limit belongs to an immutable Config and never changes.
type Limit struct {
	// Name is the optional name from the config; it is what replaces refers to
	// and what the response's current_limit.name carries.
	Name string
	// Unit and UnitMultiplier give the window: Window = UnitMultiplier × Unit,
	// at most 100 years. UnitMultiplier is ≥ 1 (0 when Unlimited).
	Unit           Unit
	UnitMultiplier uint32
	Window         time.Duration
	// RequestsPerUnit is the number of hits admitted per window (0 denies
	// all). At most 100000 for a sliding_log; for a token_bucket at most one
	// per microsecond of the window.
	RequestsPerUnit uint32
	Algorithm       Algorithm
	// Burst is the bucket capacity of a token_bucket (default
	// RequestsPerUnit); 0 for the other algorithms. Burst × the emission
	// interval (Window / RequestsPerUnit, rounded up to a whole
	// microsecond) is at most 2^53 µs.
	Burst uint32
	// Unlimited means always OK with no counting. An unlimited Limit has no
	// unit, window or algorithm.
	Unlimited bool
	// Shadow is true when this limit or its descriptor is in shadow_mode:
	// counted and reported, never denying.
	Shadow bool
	// Calendar, when not nil, makes this fixed window follow the calendar of
	// that time zone (calendar: true, time_zone): a day from local
	// midnight, an ISO week from Monday, a month from the 1st, a year from
	// January 1, whatever their length (DST days, months of 28 to 31
	// days). Window is then the unit's nominal length, for display only.
	Calendar *time.Location
	// CountDeniedHits is true when this limit or its descriptor has
	// count_denied_hits: a request's hits count whether or not it is
	// admitted (the counter may go into debt), as in envoyproxy/ratelimit.
	CountDeniedHits bool
	// Replaces lists the names of limits that this limit removes from a
	// request in which both match.
	Replaces []string

	// ID identifies this limit's counter among the limits of its descriptor
	// node: algorithm code and window in seconds, then the length-prefixed
	// name when there is one ("fw60s", "tb1s:5:burst"). Stable across reloads
	// as long as algorithm, window and name are unchanged. Contains no '{' or '}'
	// outside the name part. An unlimited limit's ID is "unlimited" (plus
	// the name part). No two limits of one node have the same ID.
	ID string
	// Label names this limit in metrics and headers: Name when set, else the
	// descriptor path and window, e.g. "remote_address/1s" or
	// "api_key/tier=gold/1d" ("remote_address=10.0.0.1/unlimited" for an
	// unlimited one). Built from config only. Where unnamed limits of one
	// node share a window, those that are not fixed windows add their
	// algorithm ("remote_address/1m/sliding_window"), so labels of one node
	// differ. A name may still equal another limit's label.
	Label string
	// Index is this limit's position in Config.Limits().
	Index int
	// Descriptor is the node this limit sits on.
	Descriptor *Descriptor

	// Line and Column locate the limit's first key in Descriptor's file.
	Line, Column int
}

// Descriptor is one node of a domain's descriptor tree. It belongs to an
// immutable Config: never modified, safe for concurrent use.
type Descriptor struct {
	Key string
	// Value is the configured value; "" means the node matches any value of
	// Key and each runtime value is counted separately.
	Value string
	// Wildcard is true when Value contains '*', which matches any run of
	// characters (including none) within the value only.
	Wildcard bool
	// Limits are the windows of this node (rate_limit or rate_limits); empty
	// when the node has none, in which case a request ending here has no
	// limit.
	Limits     []*Limit
	ShadowMode bool
	QuotaMode  bool
	// CountDeniedHits (count_denied_hits) makes every limit of the node
	// count a request's hits whether or not it is admitted.
	CountDeniedHits bool
	// DetailedMetric, ValueToMetric: accepted for compatibility; they only
	// affect envoyproxy/ratelimit's stats names.
	DetailedMetric bool
	ValueToMetric  bool
	// ShareThreshold makes all values matching this wildcard share one
	// counter: the counter key holds the pattern instead of the value.
	ShareThreshold bool
	// Shares holds, per level of the path down to this node (index =
	// Depth), the pattern that stands for the request's value in counter
	// identities where that level is a share_threshold wildcard, "" where
	// the value itself counts; nil when no level of the path shares.
	Shares []string
	// Metadata is the node's metadata map as decoded from YAML (JSON
	// compatible: map[string]any, []any, string, float64, bool, nil).
	Metadata map[string]any

	Children []*Descriptor
	// Parent is nil for a top-level node.
	Parent *Descriptor
	// Depth is 0 for a top-level node.
	Depth int
	// Path is the node's position for humans and metrics: "key" or
	// "key=value" per level joined by '/', e.g. "api_key/tier=gold".
	Path string

	// Line and Column locate the node's first key.
	Line, Column int

	index levelIndex // children's match index
	segs  []string   // Value split at '*' when Wildcard
}

// levelIndex is the match index of one level of the tree.
type levelIndex struct {
	exact     map[Entry]*Descriptor     // key + exact value
	wildcards map[string]*wildcardIndex // nodes with a wildcard value, by key
	keyOnly   map[string]*Descriptor
}

// Entry is one (key, value) pair of a request descriptor.
type Entry struct {
	Key   string
	Value string
}

// Domain is the config of one domain. It belongs to an immutable Config:
// never modified, safe for concurrent use; a nil *Domain matches nothing.
type Domain struct {
	Name        string
	Descriptors []*Descriptor
	// HTTPDescriptors say how /auth/{domain} and ext_authz build
	// descriptors from an HTTP request; nil when the domain has none.
	HTTPDescriptors []*HTTPDescriptor

	// File is the file the domain was loaded from, as given to Parse or
	// Load; Line and Column locate the document's first key.
	File         string
	Line, Column int

	index             levelIndex // top level's match index
	nameLine, nameCol int        // position of the domain's name
}

// Config is a parsed and validated set of domains. It is immutable and safe
// for concurrent use; a reload builds a new Config.
type Config struct {
	domains map[string]*Domain
	names   []string // sorted domain names
	limits  []*Limit
	files   []string
	// warnings are the keys ignored under ReferenceOptions.
	warnings []*Error
}
