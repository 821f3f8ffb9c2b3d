package config

import (
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/httpdesc"
	"github.com/rlsproject/rls/internal/match"
)

// Limit is one window of a descriptor (one element of rate_limits, or the
// rate_limit): its compiled rule, and what the config says of it beyond
// counting (its name, label, shadow mode, what it replaces). A Limit
// belongs to an immutable Config and never changes.
type Limit struct {
	// Name is the optional name from the config; it is what replaces refers to
	// and what the response's current_limit.name carries.
	Name string
	// Rule is how the limit counts (algorithm, window, requests per unit,
	// burst, calendar) and its counter's identity among the limits of its
	// node (Rule.ID); nil when Unlimited.
	Rule *engine.Rule
	// Unlimited means always OK with no counting. An unlimited Limit has no
	// rule.
	Unlimited bool
	// Shadow is true when this limit or its descriptor is in shadow_mode:
	// counted and reported, never denying.
	Shadow bool
	// CountDeniedHits is true when this limit or its descriptor has
	// count_denied_hits: a request's hits count whether or not it is
	// admitted (the counter may go into debt), as in envoyproxy/ratelimit.
	CountDeniedHits bool
	// Replaces lists the names of limits that this limit removes from a
	// request in which both match.
	Replaces []string

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

// ID identifies this limit among the limits of its descriptor node: its
// rule's counter identity (engine.Rule.ID), or for an unlimited limit
// "unlimited" plus its name part. No two limits of one node share one.
func (l *Limit) ID() string {
	if l.Rule != nil {
		return l.Rule.ID
	}
	return engine.UnlimitedID(l.Name)
}

// Descriptor is one node of a domain's descriptor tree. It belongs to an
// immutable Config: never modified, safe for concurrent use.
type Descriptor struct {
	Key string
	// Value is the configured value; "" means the node matches any value of
	// Key and each runtime value is counted separately.
	Value string
	// Wildcard is true when Value contains '*', which matches any run of
	// characters (including none) within the value only (match.IsWildcard).
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
	// Lease (lease: true) leases every limit of the node (engine.Rule.Lease).
	Lease bool
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
	// the value itself counts; nil when no level of the path shares. See
	// KeyShares.
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

	index match.Level[*Descriptor] // children's match index
}

// Entry is one (key, value) pair of a request descriptor.
type Entry = engine.Entry

// Domain is the config of one domain. It belongs to an immutable Config:
// never modified, safe for concurrent use; a nil *Domain matches nothing.
type Domain struct {
	Name        string
	Descriptors []*Descriptor
	// HTTPDescriptors say how /auth/{domain} and ext_authz build
	// descriptors from an HTTP request; nil when the domain has none.
	HTTPDescriptors httpdesc.List

	// File is the file the domain was loaded from, as given to Parse or
	// Load; Line and Column locate the document's first key.
	File         string
	Line, Column int

	index             match.Level[*Descriptor] // top level's match index
	nameLine, nameCol int                      // position of the domain's name
}

// Config is a parsed and validated set of domains. It is immutable and safe
// for concurrent use; a reload builds a new Config.
type Config struct {
	domains map[string]*Domain
	names   []string // sorted domain names
	limits  []*Limit
	files   []string
	skipped []string // test files of a directory (Skipped)
	// warnings are the keys ignored under ParseOptions.TolerateKeys.
	warnings []*Error
}

// KeyShares returns the shares (engine.AppendDescriptorKey) of a request
// descriptor of n entries that matched node d: d's Shares when the entries
// reach d, nil otherwise (d nil: a request override).
func (d *Descriptor) KeyShares(n int) []string {
	if d == nil || d.Depth != n-1 {
		return nil
	}
	return d.Shares
}

// PathEntries returns the key and value of each level from the top down to
// d (value "" for a level of any value): Path as entries. Empty for nil.
func (d *Descriptor) PathEntries() []Entry {
	if d == nil {
		return []Entry{}
	}
	path := make([]Entry, d.Depth+1)
	for n := d; n != nil; n = n.Parent {
		path[n.Depth] = Entry{Key: n.Key, Value: n.Value}
	}
	return path
}
