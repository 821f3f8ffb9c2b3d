package service

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/config"
)

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
