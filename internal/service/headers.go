package service

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
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
	seen := make(map[*descriptors.Limit]bool)
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
		lim.WriteString(strconv.FormatUint(uint64(Quota(b.Limit)), 10))
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
// RateLimit-Policy, /debug/explain): Quota hits per Window, where what
// remains of the limit (limit_remaining) is never more than Quota.
//
//   - A token bucket of requests_per_unit R per window W and burst B:
//     B per the time its empty bucket takes to fill, B × W ÷ R, rounded up
//     to whole seconds (so the advertised rate is never more than R per
//     W). With the default burst that is R per W.
//   - A calendar window (calendar: true): requests_per_unit per the length
//     of the calendar window that the answer speaks of, the one that ends
//     at its reset (29 days for February 2024, 23 hours for a day that
//     starts summer time).
//   - Any other limit: requests_per_unit per its window.
type Policy struct {
	Limit  *descriptors.Limit
	Quota  uint32
	Window time.Duration // whole seconds
}

// Quota returns what l advertises per policy window: a token bucket's
// burst (its capacity), else requests_per_unit.
func Quota(l *descriptors.Limit) uint32 {
	if l.Algorithm == descriptors.TokenBucket {
		return l.Burst
	}
	return l.RequestsPerUnit
}

// PolicyWindow returns the window that l's policy advertises, but for a
// calendar limit, whose window depends on the instant (Service.policy):
// for a token bucket the time its empty bucket takes to fill, ⌈B × W ÷ R⌉
// whole seconds (computed exactly), else l.Window.
func PolicyWindow(l *descriptors.Limit) time.Duration {
	if l.Algorithm != descriptors.TokenBucket || l.RequestsPerUnit == 0 {
		return l.Window
	}
	// ⌈B × W[µs] ÷ (R × 10⁶)⌉ in 128 bits: B × W can pass 2⁶⁴. The
	// config keeps the quotient far below maxSeconds (B × W ÷ R ≤ 2⁵³ µs);
	// beyond, the window saturates.
	const maxSeconds = math.MaxInt64 / uint64(time.Second)
	den := uint64(l.RequestsPerUnit) * 1e6
	hi, lo := bits.Mul64(uint64(l.Burst), uint64(l.Window.Microseconds()))
	if hi >= den {
		return time.Duration(maxSeconds) * time.Second
	}
	q, rem := bits.Div64(hi, lo, den)
	if rem > 0 {
		q++
	}
	return time.Duration(min(q, maxSeconds)) * time.Second
}

// policy returns l's policy in an answer whose result for l resets after
// reset. now is the instant of the answer, read from s.now on first use
// (only a calendar limit needs it) and shared by the answer's limits.
func (s *Service) policy(l *descriptors.Limit, reset time.Duration, now *time.Time) Policy {
	p := Policy{Limit: l, Quota: Quota(l), Window: PolicyWindow(l)}
	if l.Calendar != nil {
		if now.IsZero() {
			*now = s.now()
		}
		p.Window = calendarWindowEnding(l, now.Add(reset))
	}
	return p
}

// calendarLeft returns the time from now (read as policy does) to the end
// of l's calendar window holding it: a calendar limit's reset when the
// store could not say.
func (s *Service) calendarLeft(l *descriptors.Limit, now *time.Time) time.Duration {
	if now.IsZero() {
		*now = s.now()
	}
	b := engine.CalendarBounds(l, *now)
	return time.UnixMicro(b[2]).Sub(*now)
}

// calendarWindowEnding returns the length of calendar limit l's window
// that ends at end. It takes the window holding end − 12 h: every
// calendar window is at least 23 hours long (a day that starts summer
// time), so that instant lies in the window ending at end even when end
// was computed with a clock hours away from the store's.
func calendarWindowEnding(l *descriptors.Limit, end time.Time) time.Duration {
	b := engine.CalendarBounds(l, end.Add(-12*time.Hour))
	return time.Duration(b[2]-b[1]) * time.Microsecond
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
