package service

import (
	"fmt"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// Bounds on one request. A request beyond them is answered InvalidArgument
// (HTTP 400) before any counting, so nothing a client sends can make the
// server do unbounded work or hold unbounded memory.
const (
	MaxDescriptors  = 64
	MaxEntries      = config.MaxDepth
	MaxDomainLen    = 256
	MaxKeyLen       = 256
	MaxValueLen     = 4096
	MaxRequestBytes = 64 << 10 // the domain's length and all keys' and values'
	MaxHits         = engine.MaxHits
	maxOverride     = 100 * 365 * 24 * time.Hour
)

// Request is a rate-limit request, as the transports hand it over.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// HitsAddend applies to descriptors without their own Hits; 0 means 1.
	HitsAddend uint32
	// Config, when not nil, pins the request to that config: when another
	// one is current, nothing is decided and ErrConfigChanged is returned.
	// Hits given back go to the counters that took them, or nowhere.
	Config *config.Config
}

// Descriptor is one request descriptor.
type Descriptor struct {
	Entries []config.Entry
	// Override, when not nil, replaces the configured limit (the request's
	// `limit` field).
	Override *Override
	// HasHits says Hits was set by the request (0 then means: look only).
	HasHits bool
	Hits    uint64
	// Refund gives the hits back (is_negative_hits).
	Refund bool
}

// Override is a limit given by the request instead of the configured one.
type Override struct {
	RequestsPerUnit uint32
	Unit            engine.Unit
	UnitMultiplier  uint32 // 0 means 1
}

// InvalidError says why a request is malformed; Field names the offending
// field in proto terms ("descriptors[1].entries[0].key").
type InvalidError struct {
	Field string
	Msg   string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Msg }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// validate checks req against the bounds and the RateLimitService rules.
func (req *Request) validate() error {
	if err := CheckShape(req.Domain, len(req.Descriptors)); err != nil {
		return err
	}
	total := len(req.Domain)
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		if err := CheckEntryCount(i, len(d.Entries)); err != nil {
			return err
		}
		for j, e := range d.Entries {
			if err := CheckKey(i, j, len(e.Key)); err != nil {
				return err
			}
			if err := CheckValue(i, j, len(e.Value)); err != nil {
				return err
			}
			total += len(e.Key) + len(e.Value)
		}
		if d.HasHits && d.Hits > MaxHits {
			return invalid(fmt.Sprintf("descriptors[%d].hits_addend", i), "%d is more than the maximum %d", d.Hits, uint64(MaxHits))
		}
		if o := d.Override; o != nil {
			if o.Unit == engine.UnitUnknown || o.Unit.Duration() == 0 {
				return invalid(fmt.Sprintf("descriptors[%d].limit.unit", i), "must be set (SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)")
			}
			if mult := max(o.UnitMultiplier, 1); time.Duration(mult) > maxOverride/o.Unit.Duration() {
				return invalid(fmt.Sprintf("descriptors[%d].limit.unit_multiplier", i), "%d %ss is longer than 100 years", mult, o.Unit)
			}
		}
	}
	return CheckTotal(total, false)
}

// CheckShape checks the first things a request is checked for: its domain
// and its number of descriptors n. It returns the error that deciding the
// request would return for them, nil when they are fine. A transport that
// decodes a request itself calls it (and CheckEntryCount) while decoding,
// before it builds per-descriptor state, so that a request of a million
// descriptors costs no more than reading it.
func CheckShape(domain string, n int) error {
	switch {
	case domain == "":
		return invalid("domain", "must not be empty")
	case len(domain) > MaxDomainLen:
		return CheckDomainLen(len(domain))
	}
	return CheckDescriptorCount(n, false)
}

// The checks below are validate's, one bound each, for a transport that
// checks a request while it reads it and stops at the first bound crossed
// (POST /json): each returns the error that deciding the request would
// return for that field, nil when the value is within the bound. Where
// such a transport stops counting at the bound, atLeast says that n is
// what it has seen so far ("65 descriptors or more").

// CheckDomainLen checks the length n of a non-empty domain.
func CheckDomainLen(n int) error {
	if n > MaxDomainLen {
		return invalid("domain", "longer than %d bytes", MaxDomainLen)
	}
	return nil
}

// CheckDescriptorCount checks the number n of descriptors of a request.
func CheckDescriptorCount(n int, atLeast bool) error {
	switch {
	case n == 0:
		return invalid("descriptors", "must not be empty")
	case n > MaxDescriptors:
		return invalid("descriptors", "%d descriptors%s, at most %d allowed", n, orMore(atLeast), MaxDescriptors)
	}
	return nil
}

// CheckEntryCount checks the number of entries n of descriptor i, as
// deciding the request would (see CheckShape).
func CheckEntryCount(i, n int) error { return CheckEntries(i, n, false) }

// CheckEntries checks the number of entries n of descriptor i.
func CheckEntries(i, n int, atLeast bool) error {
	switch {
	case n == 0:
		return invalid(fmt.Sprintf("descriptors[%d].entries", i), "must not be empty")
	case n > MaxEntries:
		return invalid(fmt.Sprintf("descriptors[%d].entries", i), "%d entries%s, at most %d allowed", n, orMore(atLeast), MaxEntries)
	}
	return nil
}

// CheckKey checks the length n of the key of entry j of descriptor i.
func CheckKey(i, j, n int) error {
	switch {
	case n == 0:
		return invalid(fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), "must not be empty")
	case n > MaxKeyLen:
		return invalid(fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), "longer than %d bytes", MaxKeyLen)
	}
	return nil
}

// CheckValue checks the length n of the value of entry j of descriptor i.
func CheckValue(i, j, n int) error {
	if n > MaxValueLen {
		return invalid(fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), "longer than %d bytes", MaxValueLen)
	}
	return nil
}

// CheckTotal checks total, the length of the domain and of all keys and
// values of a request.
func CheckTotal(total int, atLeast bool) error {
	if total > MaxRequestBytes {
		return invalid("descriptors", "%d bytes of keys and values%s, at most %d allowed", total, orMore(atLeast), MaxRequestBytes)
	}
	return nil
}

func orMore(atLeast bool) string {
	if atLeast {
		return " or more"
	}
	return ""
}

// OverrideLabel is the label of every request override's limit.
const OverrideLabel = "override"

// overrideLimit builds the limit of a request override (validate checked
// it). Its counter is the one of a configured, unnamed fixed window of the
// same length on the same entries, as in envoyproxy/ratelimit.
func overrideLimit(o *Override) *config.Limit {
	return &config.Limit{
		Rule:  engine.MustCompile(engine.Spec{Unit: o.Unit, Multiplier: max(o.UnitMultiplier, 1), Limit: o.RequestsPerUnit}),
		Label: OverrideLabel,
		Index: -1,
	}
}

// Code is the verdict on a request or a descriptor. The values are those of
// the RateLimitService protocol; a response never carries 0 (UNKNOWN).
type Code uint8

// The codes.
const (
	OK        Code = 1
	OverLimit Code = 2
)

func (c Code) String() string {
	if c == OverLimit {
		return "OVER_LIMIT"
	}
	return "OK"
}

// Response is the answer to a Request.
type Response struct {
	Code Code
	// Never says that an OVER_LIMIT request can never pass as it is, however
	// long the client waits: it asks more hits of a limit than the limit
	// (or a token bucket's burst) admits. Its headers carry no Retry-After.
	Never bool
	// Statuses are 1:1 with the request's descriptors, in order.
	Statuses []Status
	// Headers are the rate-limit headers for the client's response, per the
	// service's header mode (always both drafts for CheckHTTP).
	Headers []Header
	// Metadata is the answer's dynamic metadata, which answer rules may
	// set (hooks.go): JSON-compatible values; nil when there is none.
	Metadata map[string]any

	statusBuf [4]Status // Statuses of small requests, in the same allocation
}

// Status is the verdict on one descriptor.
type Status struct {
	Code Code
	// Never marks an OVER_LIMIT status whose limit can never admit the
	// descriptor's hits (engine.Result.Never); ResetAfter is then the
	// limit's reset.
	Never bool
	// Limit is the binding limit: a denying one, else the one with the least
	// remaining (ties: the longest window). nil when no limit applies.
	Limit *config.Limit
	// Remaining is what Limit still admits; MaxUint32 for an unlimited
	// descriptor, 0 when no limit applies.
	Remaining uint32
	// ResetAfter is, for a denying limit, the time until the request could be
	// admitted; otherwise, or when Never, Limit's reset (engine.Result.Reset).
	ResetAfter time.Duration
	// Policies are all the limits judged for this descriptor (Limit among
	// them), as the headers advertise them; filled when the answer has
	// headers.
	Policies []Policy
}

// Header is one response header.
type Header struct {
	Key, Value string
}
