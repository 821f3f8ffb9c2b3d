package service

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
)

// headerFixture is a service with every header on, deciding on a memory
// store whose clock is also the service's.
func headerFixture(t *testing.T, yaml string, start time.Time) (*Service, *storetest.Clock) {
	t.Helper()
	cfg, err := config.Parse("headers.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	clock := storetest.NewClock(start)
	ms := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(func() { ms.Close() })
	svc := New(Options{Store: ms, Headers: HeadersBoth, Now: clock.Now})
	svc.SetConfig(cfg)
	return svc, clock
}

// policyItems parses the quota-policy items of X-RateLimit-Limit (after
// its first value) or RateLimit-Policy into "q/w" strings.
func policyItems(h string, draft03 bool) (first string, items []string) {
	parts := strings.Split(h, ", ")
	if draft03 {
		first, parts = parts[0], parts[1:]
	}
	for _, p := range parts {
		var q, w string
		for i, f := range strings.Split(p, ";") {
			switch {
			case draft03 && i == 0:
				q = f
			case strings.HasPrefix(f, "q="):
				q = f[2:]
			case strings.HasPrefix(f, "w="):
				w = f[2:]
			}
		}
		items = append(items, q+"/"+w)
	}
	return first, items
}

// TestTokenBucketHeadersNeverAdvertiseMoreRemainingThanTheLimit is the
// audit's finding: {1/s, burst 3} answered X-RateLimit-Limit 1 with
// X-RateLimit-Remaining 2 ("2 left of 1"). A token bucket is advertised as
// its burst over the time its empty bucket takes to fill, rounded up to
// whole seconds (never more than its rate); with the default burst that
// is its own rate and window. Every answer of a run says it the same way
// in both drafts, and remaining never exceeds the quota.
func TestTokenBucketHeadersNeverAdvertiseMoreRemainingThanTheLimit(t *testing.T) {
	for _, tc := range []struct {
		limit  string
		policy string // quota/window in seconds
	}{
		{"{unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}", "3/3"},
		{"{unit: second, requests_per_unit: 50, algorithm: token_bucket, burst: 100}", "100/2"},
		{"{unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 9}", "9/1"},     // 0.9 s, rounded up
		{"{unit: hour, requests_per_unit: 1000, algorithm: token_bucket, burst: 50}", "50/180"}, // 3.6 s per token
		{"{unit: minute, requests_per_unit: 7, algorithm: token_bucket, burst: 2}", "2/18"},     // 17.14 s, rounded up
		{"{unit: second, requests_per_unit: 3, algorithm: token_bucket}", "3/1"},                // default burst: as configured
		{"{unit: minute, unit_multiplier: 5, requests_per_unit: 1000, algorithm: token_bucket}", "1000/300"},
		{"{unit: second, requests_per_unit: 3}", "3/1"}, // a fixed window, for contrast
	} {
		yaml := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + tc.limit + "\n"
		svc, clock := headerFixture(t, yaml, storetest.T0)
		req := &Request{Domain: "d", Descriptors: []Descriptor{desc("k", "v")}}
		wantQ, _, _ := strings.Cut(tc.policy, "/")
		for i := range 6 {
			resp, err := svc.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			h := headerMap(resp)
			first, xitems := policyItems(h[headerXLimit], true)
			_, pitems := policyItems(h[headerPolicy], false)
			remaining, _ := strconv.Atoi(h[headerXRemaining])
			q, _ := strconv.Atoi(first)
			if first != wantQ || len(xitems) != 1 || xitems[0] != tc.policy || len(pitems) != 1 || pitems[0] != tc.policy {
				t.Errorf("%s, answer %d: X-RateLimit-Limit %q, RateLimit-Policy %q; want %s (quota/window) in both", tc.limit, i, h[headerXLimit], h[headerPolicy], tc.policy)
			}
			if remaining > q || resp.Statuses[0].Remaining > uint32(q) {
				t.Errorf("%s, answer %d: remaining %d (status %d) of a quota of %d", tc.limit, i, remaining, resp.Statuses[0].Remaining, q)
			}
			if r := h[headerRateLimit]; !strings.Contains(r, ";r="+h[headerXRemaining]+";") {
				t.Errorf("%s, answer %d: RateLimit %q, want r=%s as X-RateLimit-Remaining", tc.limit, i, r, h[headerXRemaining])
			}
			clock.Set(clock.Now().Add(300 * time.Millisecond))
		}
	}
}

// TestCalendarWindowsAdvertiseTheirOwnLength is the audit's second
// finding: a calendar month advertised w=2592000 (30 days) whatever the
// month. A calendar limit's policy window is the length of the calendar
// window the answer speaks of, the one that ends at its reset: February
// 2024 29 days, March 31, a DST day in Paris 23 hours, the ISO week
// holding it 167 hours, a leap year 366 days.
func TestCalendarWindowsAdvertiseTheirOwnLength(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: month, requests_per_unit: 1000, calendar: true}
      - {unit: day, requests_per_unit: 100, calendar: true, time_zone: Europe/Paris}
      - {unit: week, requests_per_unit: 500, calendar: true, time_zone: Europe/Paris}
      - {unit: year, requests_per_unit: 90000, calendar: true}
`
	day := int64(24 * 3600)
	for _, tc := range []struct {
		at                       time.Time
		month, dayW, week, yearW int64
	}{
		{time.Date(2024, 2, 10, 12, 0, 0, 0, time.UTC), 29 * day, day, 7 * day, 366 * day},
		{time.Date(2024, 3, 31, 12, 0, 0, 0, time.UTC), 31 * day, day - 3600, 7*day - 3600, 366 * day},
		{time.Date(2024, 3, 31, 23, 59, 0, 0, time.UTC), 31 * day, day, 7 * day, 366 * day}, // April 1 in Paris
		{time.Date(2023, 10, 29, 10, 0, 0, 0, time.UTC), 31 * day, day + 3600, 7*day + 3600, 365 * day},
		{time.Date(2023, 4, 30, 21, 0, 0, 0, time.UTC), 30 * day, day, 7 * day, 365 * day},
	} {
		svc, _ := headerFixture(t, yaml, tc.at)
		resp, err := svc.ShouldRateLimit(context.Background(), &Request{Domain: "d", Descriptors: []Descriptor{desc("k", "v")}})
		if err != nil {
			t.Fatal(err)
		}
		h := headerMap(resp)
		want := fmt.Sprintf("1000/%d 100/%d 500/%d 90000/%d", tc.month, tc.dayW, tc.week, tc.yearW)
		_, x := policyItems(h[headerXLimit], true)
		_, p := policyItems(h[headerPolicy], false)
		if strings.Join(x, " ") != want || strings.Join(p, " ") != want {
			t.Errorf("at %s: X-RateLimit-Limit %q, RateLimit-Policy %q; want the windows %s", tc.at, h[headerXLimit], h[headerPolicy], want)
		}
	}
}

// TestCalendarWindowWithClockSkew: the store's clock (Redis TIME) and the
// service's may differ; the window advertised is still the one that ends
// at the store's reset, hours of skew either way.
func TestCalendarWindowWithClockSkew(t *testing.T) {
	const yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 10, calendar: true}\n"
	storeAt := time.Date(2024, 2, 29, 23, 59, 0, 0, time.UTC) // one minute before March
	for _, skew := range []time.Duration{0, time.Second, -time.Second, 2 * time.Hour, -2 * time.Hour, 10 * time.Hour} {
		cfg, err := config.Parse("skew.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		clock := storetest.NewClock(storeAt)
		ms := memstore.New(memstore.Options{Now: clock.Now})
		svc := New(Options{Store: ms, Headers: HeadersBoth, Now: func() time.Time { return storeAt.Add(skew) }})
		svc.SetConfig(cfg)
		resp, err := svc.ShouldRateLimit(context.Background(), &Request{Domain: "d", Descriptors: []Descriptor{desc("k", "v")}})
		ms.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := headerMap(resp)[headerPolicy]; !strings.HasSuffix(got, ";q=10;w=2505600") {
			t.Errorf("skew %s: RateLimit-Policy %q, want February's 29 days (w=2505600)", skew, got)
		}
	}
}

// TestExplainShowsThePolicy: /debug/explain says how answers advertise
// each limit, the same quota and window as the headers.
func TestExplainShowsThePolicy(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
      - {unit: month, requests_per_unit: 1000, calendar: true}
      - {unit: minute, requests_per_unit: 20}
`
	svc, _ := headerFixture(t, yaml, time.Date(2024, 2, 10, 12, 0, 0, 0, time.UTC))
	req := &Request{Domain: "d", Descriptors: []Descriptor{desc("k", "v")}}
	ex, err := svc.Explain(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range ex.Descriptors[0].Limits {
		if l.Policy == nil {
			t.Fatalf("limit %s has no policy", l.Limit.Label)
		}
		got = append(got, fmt.Sprintf("%d/%d", l.Policy.Quota, int64(l.Policy.Window/time.Second)))
	}
	resp, err := svc.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	_, headers := policyItems(headerMap(resp)[headerPolicy], false)
	if want := "3/3 1000/2505600 20/60"; strings.Join(got, " ") != want || strings.Join(headers, " ") != want {
		t.Errorf("explain's policies %v, the headers' %v; want %s in both", got, headers, want)
	}
}
