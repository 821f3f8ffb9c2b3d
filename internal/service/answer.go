package service

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// The answer to a request: each descriptor's status from the store's
// results and the limit that binds it (or the store-error policy's
// answer), told to the observers, then the rate-limit headers and the
// answer rules.

// fillStatuses turns the store's results for d's items into resp's
// statuses, one per descriptor: the limit that binds it and, with
// withLimits, every limit's policy for the headers.
func (s *Service) fillStatuses(resp *Response, d *Decision, withLimits bool) {
	var now time.Time // read once, when a calendar limit needs it
	for i := range d.Items {
		it, r, l := &d.Items[i], &d.Results[i], d.Limits[i]
		st := &resp.Statuses[d.Owners[i]]
		if withLimits {
			st.Policies = append(st.Policies, s.policy(l, r.Reset, &now))
		}
		if binds(st, it, r) {
			st.Limit = l
			st.Remaining = uint32(min(r.Remaining, math.MaxUint32))
			st.ResetAfter = r.Reset
			st.Never = false
			if !r.Admitted && !it.Shadow {
				st.Code = OverLimit
				if st.Never = r.Never; !r.Never {
					st.ResetAfter = r.RetryAfter
				}
			}
		}
	}
}

// binds reports whether item it (with result r) is more binding than the
// limit that st holds so far (see bindKey).
func binds(st *Status, it *engine.Item, r *engine.Result) bool {
	if st.Limit == nil {
		return true
	}
	deny := !r.Admitted && !it.Shadow
	k := bindKey{shadow: it.Shadow, deny: deny, never: deny && r.Never, wait: r.Reset, remaining: r.Remaining, window: it.Rule.Window}
	if deny && !r.Never {
		k.wait = r.RetryAfter
	}
	return k.over(st.bindKey())
}

// bindKey is what decides which limit binds a descriptor (its status) or a
// response (its single-valued headers): a denying non-shadow limit beats
// the others (one that never admits, else the one that waits longest),
// then the least remaining, then the longest window. Shadow limits bind
// only what has nothing else.
type bindKey struct {
	shadow, deny, never bool
	wait                time.Duration // until the retry when denying, else the reset
	remaining           uint64
	window              time.Duration
}

func (st *Status) bindKey() bindKey {
	return bindKey{shadow: st.Limit.Shadow, deny: st.Code == OverLimit, never: st.Never, wait: st.ResetAfter, remaining: uint64(st.Remaining), window: st.Limit.Rule.Window}
}

// over reports whether k binds rather than b.
func (k bindKey) over(b bindKey) bool {
	switch {
	case k.shadow != b.shadow:
		return b.shadow
	case k.deny != b.deny:
		return k.deny
	case k.deny && k.never != b.never:
		return k.never
	case k.deny:
		return k.wait > b.wait
	case k.remaining != b.remaining:
		return k.remaining < b.remaining
	}
	return k.window > b.window
}

// storeFailed answers the decision in sc, whose store call failed with
// err, per the store-error policy: resp as it is (allow), resp denied
// (deny), or the error. It tells the observers.
func (s *Service) storeFailed(cur *loaded, sc *scratch, resp *Response, mode HeaderMode, err error) (*Response, error) {
	d := &sc.decision
	d.StoreErr = err
	s.errLog.Do(func() {
		s.log.Warn("store call failed", "domain", d.Request.Domain, "policy", s.onStoreError, "error", err)
	})
	switch s.onStoreError {
	case FailAllow:
	case FailDeny:
		s.denyAll(resp, sc, mode)
	default:
		d.Response = nil
	}
	s.observe(cur, d)
	if d.Response == nil {
		return nil, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	return resp, nil
}

// denyAll answers every limit of sc's items in resp as denying (FailDeny):
// with no result, each for its window from now (a calendar limit for what
// is left of its window), with the headers of mode and no answer rule.
func (s *Service) denyAll(resp *Response, sc *scratch, mode HeaderMode) {
	resp.Code = OverLimit
	var now time.Time
	for i, it := range sc.items {
		st, l := &resp.Statuses[sc.owner[i]], sc.limits[i]
		reset := l.Rule.Window
		if l.Rule.Calendar != nil {
			reset = s.calendarLeft(l, &now)
		}
		if !it.Shadow && st.Limit == nil {
			st.Code = OverLimit
			st.Limit = l
			st.ResetAfter = reset
		}
		if mode != HeadersOff {
			st.Policies = append(st.Policies, s.policy(l, reset, &now)) // every policy in the headers
		}
	}
	resp.Headers = appendHeaders(nil, mode, resp)
}

// observe tells the observers of decision d, made on the config cur (nil
// when none is loaded).
func (s *Service) observe(cur *loaded, d *Decision) {
	for i, o := range s.observers {
		var state any
		if cur != nil {
			state = cur.observed[i]
		}
		o.Decided(state, d)
	}
}

// finishAnswer completes resp, a decided answer for req, whose
// descriptors matched nodes (nil for a domain the config lacks): the
// headers of mode, then the answer rules.
func (s *Service) finishAnswer(req *Request, nodes []*config.Descriptor, resp *Response, mode HeaderMode) {
	resp.Headers = appendHeaders(nil, mode, resp)
	if len(s.rules) > 0 {
		a := Answer{Request: req, Response: resp, Nodes: nodes}
		for _, r := range s.rules {
			r.Finish(&a)
		}
	}
}

// HeaderMode selects the rate-limit headers of a response.
type HeaderMode uint8

// The header modes (--response-headers).
const (
	HeadersOff HeaderMode = iota
	// HeadersDraft03: X-RateLimit-Limit, -Remaining, -Reset, as Envoy's
	// enable_x_ratelimit_headers: DRAFT_VERSION_03 writes them.
	HeadersDraft03
	// HeadersDraft11: RateLimit-Policy and RateLimit of
	// draft-ietf-httpapi-ratelimit-headers-11.
	HeadersDraft11
	HeadersBoth
)

// ParseHeaderMode parses off|draft03|draft11|both.
func ParseHeaderMode(s string) (HeaderMode, error) {
	switch s {
	case "off":
		return HeadersOff, nil
	case "draft03":
		return HeadersDraft03, nil
	case "draft11":
		return HeadersDraft11, nil
	case "both":
		return HeadersBoth, nil
	}
	return 0, fmt.Errorf("%q is not one of off|draft03|draft11|both", s)
}

// Header names.
const (
	headerXLimit     = "X-RateLimit-Limit"
	headerXRemaining = "X-RateLimit-Remaining"
	headerXReset     = "X-RateLimit-Reset"
	headerPolicy     = "RateLimit-Policy"
	headerRateLimit  = "RateLimit"
	headerRetryAfter = "Retry-After"
)

// CeilSeconds rounds d up to whole seconds, as clients read them: in the
// headers and in Envoy's duration_until_reset.
func CeilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfter returns the Retry-After of an OVER_LIMIT response: the longest
// wait among the denying descriptors that a wait can lift, in whole
// seconds, at least 1. A response that is Never has none to give: its
// headers carry no Retry-After.
func (r *Response) RetryAfter() int64 {
	var longest time.Duration
	for i := range r.Statuses {
		if st := &r.Statuses[i]; st.Code == OverLimit && !st.Never && st.ResetAfter > longest {
			longest = st.ResetAfter
		}
	}
	return max(1, CeilSeconds(longest))
}

// binding returns the status that the single-valued headers describe: the
// one whose limit binds (bindKey) among the statuses with a limit; shadow
// limits are never shown to clients. nil when no status has a limit.
func (r *Response) binding() *Status {
	var b *Status
	for i := range r.Statuses {
		st := &r.Statuses[i]
		if st.Limit == nil || st.Limit.Shadow {
			continue
		}
		if b == nil || st.bindKey().over(b.bindKey()) {
			b = st
		}
	}
	return b
}

// policies calls f once for every distinct non-shadow limit of the
// response, with its policy.
func (r *Response) policies(f func(*Policy)) {
	seen := make(map[*config.Limit]bool)
	for i := range r.Statuses {
		st := &r.Statuses[i]
		for j := range st.Policies {
			if p := &st.Policies[j]; !p.Limit.Shadow && !seen[p.Limit] {
				seen[p.Limit] = true
				f(p)
			}
		}
	}
}

// appendHeaders appends the headers of mode for resp.
func appendHeaders(dst []Header, mode HeaderMode, resp *Response) []Header {
	if mode == HeadersOff {
		return dst
	}
	b := resp.binding()
	if b == nil {
		return dst
	}
	reset := strconv.FormatInt(CeilSeconds(b.ResetAfter), 10)
	if mode == HeadersDraft03 || mode == HeadersBoth {
		var lim strings.Builder
		lim.WriteString(strconv.FormatUint(min(b.Limit.Rule.Capacity(), math.MaxUint32), 10))
		resp.policies(func(p *Policy) {
			fmt.Fprintf(&lim, ", %d;w=%d", p.Quota, int64(p.Window/time.Second))
			if p.Limit.Name != "" {
				fmt.Fprintf(&lim, ";name=%s", sfString(p.Limit.Name))
			}
		})
		dst = append(dst,
			Header{headerXLimit, lim.String()},
			Header{headerXRemaining, strconv.FormatUint(uint64(b.Remaining), 10)},
			Header{headerXReset, reset},
		)
	}
	if mode == HeadersDraft11 || mode == HeadersBoth {
		var pol strings.Builder
		resp.policies(func(p *Policy) {
			if pol.Len() > 0 {
				pol.WriteString(", ")
			}
			fmt.Fprintf(&pol, "%s;q=%d;w=%d", sfString(p.Limit.Label), p.Quota, int64(p.Window/time.Second))
		})
		dst = append(dst,
			Header{headerPolicy, pol.String()},
			Header{headerRateLimit, fmt.Sprintf("%s;r=%d;t=%s", sfString(b.Limit.Label), b.Remaining, reset)},
		)
	}
	if resp.Code == OverLimit && !resp.Never {
		dst = append(dst, Header{headerRetryAfter, strconv.FormatInt(resp.RetryAfter(), 10)})
	}
	return dst
}

// Policy is a limit as an answer advertises it (X-RateLimit-Limit,
// RateLimit-Policy, /debug/explain): Quota hits per Window, the rule's
// capacity per its quota window (engine.Rule.QuotaWindow: a token bucket's
// fill time, a calendar window's own length), so that what remains of the
// limit (limit_remaining) is never more than Quota.
type Policy struct {
	Limit  *config.Limit
	Quota  uint32
	Window time.Duration // whole seconds
}

// policy returns l's policy in an answer whose result for l resets after
// reset: the rule's capacity per its quota window (engine.Rule.QuotaWindow).
// now is the instant of the answer, read from s.now on first use (only a
// calendar limit's window depends on it) and shared by the answer's
// limits.
func (s *Service) policy(l *config.Limit, reset time.Duration, now *time.Time) Policy {
	r := l.Rule
	var end time.Time
	if r.Calendar != nil {
		if now.IsZero() {
			*now = s.now()
		}
		end = now.Add(reset)
	}
	return Policy{Limit: l, Quota: uint32(min(r.Capacity(), math.MaxUint32)), Window: r.QuotaWindow(end)}
}

// calendarLeft returns the time from now (read as policy does) to the end
// of calendar limit l's window holding it: its reset when the store could
// not say.
func (s *Service) calendarLeft(l *config.Limit, now *time.Time) time.Duration {
	if now.IsZero() {
		*now = s.now()
	}
	b, _ := l.Rule.CalendarBounds(now.UnixMicro())
	return time.UnixMicro(b[2]).Sub(*now)
}

// sfString renders s as a Structured Field string (RFC 8941): quoted, with
// '"' and '\' escaped and bytes outside printable ASCII replaced by '?'.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
