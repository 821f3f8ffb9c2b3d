package service

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func headerMap(resp *Response) map[string]string {
	got := map[string]string{}
	for _, h := range resp.Headers {
		got[h.Key] = h.Value
	}
	return got
}

// TestNeverPassesHasNoRetryAfter is the review's bug: a cost of 4 against a
// limit of 3 per second got Retry-After: 1, which a client obeys for ever.
// Such a request is OVER_LIMIT with no Retry-After, its
// duration_until_reset is the limit's reset (not a retry), and it is
// counted and logged.
func TestNeverPassesHasNoRetryAfter(t *testing.T) {
	var logs bytes.Buffer
	f := newFixture(t, Options{Headers: HeadersBoth, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	big := desc("remote_address", "10.9.9.9")
	big.HasHits, big.Hits = true, 4
	req := &Request{Domain: "api", Descriptors: []Descriptor{big}}
	for i := range 3 {
		resp := f.check(t, req)
		st := resp.Statuses[0]
		if resp.Code != OverLimit || !resp.Never || st.Code != OverLimit || !st.Never {
			t.Fatalf("request %d: hits 4 against 3/s: %s never=%v (status %s never=%v), want OVER_LIMIT never", i, resp.Code, resp.Never, st.Code, st.Never)
		}
		if st.Limit == nil || st.Limit.Rule.Window != time.Second || st.ResetAfter != time.Second || st.Remaining != 3 {
			t.Errorf("request %d: binding %v reset %s remaining %d, want the 1s limit (the one that never admits 4), reset 1s, 3 remaining", i, st.Limit, st.ResetAfter, st.Remaining)
		}
		h := headerMap(resp)
		if v, ok := h[headerRetryAfter]; ok {
			t.Errorf("request %d: Retry-After %q on a request that can never pass", i, v)
		}
		if h[headerXReset] != "1" || h[headerXRemaining] != "3" {
			t.Errorf("request %d: X-RateLimit-Reset %q, -Remaining %q; want the limit's own reset 1 and remaining 3", i, h[headerXReset], h[headerXRemaining])
		}
	}
	if got := f.seen.never; got != 3 {
		t.Errorf("observers told of %d requests that never pass, want 3", got)
	}
	if n := strings.Count(logs.String(), "can ever admit"); n != 1 {
		t.Errorf("%d log lines for 3 impossible requests in a row, want 1 (bounded rate):\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "limit=remote_address/1s") || !strings.Contains(logs.String(), "hits=4") || !strings.Contains(logs.String(), "capacity=3") {
		t.Errorf("log %q does not name the limit, the hits and the capacity", logs.String())
	}
	// The denials cost nothing: 3 single hits still pass.
	one := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.9.9.9")}}
	for i := range 3 {
		if resp := f.check(t, one); resp.Code != OK {
			t.Fatalf("single hit %d after the impossible requests: %s, want OK", i, resp.Code)
		}
	}
}

func TestNeverAmongDescriptors(t *testing.T) {
	hits := func(d Descriptor, n uint64) Descriptor {
		d.HasHits, d.Hits = true, n
		return d
	}
	for _, tc := range []struct {
		name  string
		setup []*Request
		req   *Request
		never bool
		retry string // Retry-After, "" for none
	}{
		{
			name:  "one descriptor waits, the other never passes",
			setup: []*Request{{Domain: "api", Descriptors: []Descriptor{hits(desc("api_key", "a1"), 2)}}},
			req:   &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "a1"), hits(desc("remote_address", "10.0.0.2"), 4)}},
			never: true,
		},
		{
			name:  "a wait lifts the denial",
			setup: []*Request{{Domain: "api", Descriptors: []Descriptor{hits(desc("api_key", "a2"), 2)}}},
			req:   &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "a2"), desc("remote_address", "10.0.0.3")}},
			retry: "3600",
		},
		{
			name:  "a shadow limit that never admits denies nothing",
			req:   &Request{Domain: "api", Descriptors: []Descriptor{hits(desc("tenant", "t9"), 2), hits(desc("remote_address", "10.0.0.4"), 2)}},
			never: false,
		},
		{
			// Quota groups deny together; one of them never passes but the
			// other may, after a wait.
			name:  "one quota group never passes, the other waits",
			setup: []*Request{{Domain: "api", Descriptors: []Descriptor{desc("quota", "q1")}}},
			req:   &Request{Domain: "api", Descriptors: []Descriptor{desc("quota", "q1"), hits(desc("quota", "q2"), 2)}},
			retry: "60",
		},
		{
			// A wait lifts the plain denial, but not the groups'.
			name:  "a descriptor waits and every quota group never passes",
			setup: []*Request{{Domain: "api", Descriptors: []Descriptor{hits(desc("api_key", "a3"), 2)}}},
			req:   &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "a3"), hits(desc("quota", "q5"), 2), hits(desc("quota", "q6"), 2)}},
			never: true,
		},
		{
			name:  "every quota group never passes",
			req:   &Request{Domain: "api", Descriptors: []Descriptor{hits(desc("quota", "q3"), 2), hits(desc("quota", "q4"), 2)}},
			never: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Options{Headers: HeadersBoth})
			for _, r := range tc.setup {
				f.check(t, r)
			}
			resp := f.check(t, tc.req)
			if tc.never != resp.Never {
				t.Errorf("Never = %v, want %v (code %s, statuses %+v)", resp.Never, tc.never, resp.Code, resp.Statuses)
			}
			if resp.Code != OverLimit && (tc.never || tc.retry != "") {
				t.Fatalf("code %s, want OVER_LIMIT", resp.Code)
			}
			if got := headerMap(resp)[headerRetryAfter]; got != tc.retry {
				t.Errorf("Retry-After %q, want %q", got, tc.retry)
			}
		})
	}
}
