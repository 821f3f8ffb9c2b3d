package envoyrls

import (
	"context"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// envoyUnitSeconds is the window Envoy's rate-limit filter gives a
// current_limit's unit in X-RateLimit-Limit (unit_multiplier is not
// applied; UNKNOWN writes no item): /work/shared/reference, "Envoy
// converts units to window seconds".
var envoyUnitSeconds = map[rlsv3.RateLimitResponse_RateLimit_Unit]int64{
	rlsv3.RateLimitResponse_RateLimit_SECOND: 1,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: 60,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   3600,
	rlsv3.RateLimitResponse_RateLimit_DAY:    86400,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   604800,
	rlsv3.RateLimitResponse_RateLimit_MONTH:  2592000,
	rlsv3.RateLimitResponse_RateLimit_YEAR:   31536000,
}

// envoyXRateLimit returns the X-RateLimit-Limit and -Remaining that Envoy
// writes for resp under enable_x_ratelimit_headers: DRAFT_VERSION_03: of
// the status with the least limit_remaining among those with a
// current_limit, its requests_per_unit, then one "rpu;w=<unit seconds>"
// item per such status.
func envoyXRateLimit(resp *rlsv3.RateLimitResponse) (limit, remaining string) {
	var min *rlsv3.RateLimitResponse_DescriptorStatus
	var items strings.Builder
	for _, st := range resp.GetStatuses() {
		l := st.GetCurrentLimit()
		if l == nil {
			continue
		}
		if min == nil || st.GetLimitRemaining() < min.GetLimitRemaining() {
			min = st
		}
		if w := envoyUnitSeconds[l.GetUnit()]; w > 0 {
			fmt.Fprintf(&items, ", %d;w=%d", l.GetRequestsPerUnit(), w)
		}
	}
	if min == nil {
		return "", ""
	}
	return fmt.Sprintf("%d%s", min.GetCurrentLimit().GetRequestsPerUnit(), items.String()), strconv.FormatUint(uint64(min.GetLimitRemaining()), 10)
}

// TestTokenBucketCurrentLimitAsEnvoyReadsIt is the audit's first finding
// on the gRPC side: {1/s, burst 3} answered current_limit {1/SECOND} with
// limit_remaining 2, and Envoy's own X-RateLimit headers said "2 left of
// 1". current_limit now carries the bucket's policy, its burst over the
// shortest unit that its fill time does not pass, so that what Envoy
// writes from it agrees with rls's own headers on the quota, never has
// more remaining than the quota, and never states a higher rate than the
// limit's (Envoy ignores unit_multiplier: a 3 s fill time written as
// SECOND × 3 would read as 3 per second).
func TestTokenBucketCurrentLimitAsEnvoyReadsIt(t *testing.T) {
	for _, tc := range []struct {
		limit        string
		rate, window int64 // requests_per_unit per window seconds, as configured
		envoy        string
		policy       string // rls's own RateLimit-Policy q and w
	}{
		{"{unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 3}", 1, 1, "3, 3;w=60", "q=3;w=3"},
		{"{unit: second, requests_per_unit: 50, algorithm: token_bucket, burst: 100}", 50, 1, "100, 100;w=60", "q=100;w=2"},
		{"{unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 9}", 10, 1, "9, 9;w=1", "q=9;w=1"},
		{"{unit: hour, requests_per_unit: 1000, algorithm: token_bucket, burst: 50}", 1000, 3600, "50, 50;w=3600", "q=50;w=180"},
		{"{unit: day, requests_per_unit: 1, algorithm: token_bucket, burst: 10}", 1, 86400, "10, 10;w=2592000", "q=10;w=864000"},
		{"{unit: minute, requests_per_unit: 100, algorithm: token_bucket}", 100, 60, "100, 100;w=60", "q=100;w=60"}, // the default burst: as before
		{"{unit: second, requests_per_unit: 5}", 5, 1, "5, 5;w=1", "q=5;w=1"},
	} {
		yaml := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + tc.limit + "\n"
		clock := storetest.NewClock(storetest.T0)
		svc := servetest.Service(t, yaml, service.Options{Store: servetest.MemoryStore(t, clock.Now), Headers: service.HeadersDraft11, Now: clock.Now})
		s := New(svc)
		req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("k", "v")}}
		for i := range 4 {
			resp, err := s.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			limit, remaining := envoyXRateLimit(resp)
			if limit != tc.envoy {
				t.Errorf("%s, answer %d: current_limit %v: Envoy writes X-RateLimit-Limit %q, want %q", tc.limit, i, resp.Statuses[0].GetCurrentLimit(), limit, tc.envoy)
			}
			cl := resp.Statuses[0].GetCurrentLimit()
			if cl.GetUnitMultiplier() != nil {
				t.Errorf("%s: unit_multiplier %v, which Envoy would ignore", tc.limit, cl.GetUnitMultiplier())
			}
			rem, _ := strconv.Atoi(remaining)
			rpu := cl.GetRequestsPerUnit()
			if uint32(rem) > rpu {
				t.Errorf("%s, answer %d: Envoy writes X-RateLimit-Remaining %d of a limit of %d", tc.limit, i, rem, rpu)
			}
			// rpu / unit seconds ≤ rate / window
			w := envoyUnitSeconds[cl.GetUnit()]
			if new(big.Int).Mul(big.NewInt(int64(rpu)), big.NewInt(tc.window)).Cmp(new(big.Int).Mul(big.NewInt(tc.rate), big.NewInt(w))) > 0 {
				t.Errorf("%s: Envoy advertises %d per %d s, more than %d per %d s", tc.limit, rpu, w, tc.rate, tc.window)
			}
			var pol string
			for _, h := range resp.GetResponseHeadersToAdd() {
				if h.GetKey() == "RateLimit-Policy" {
					pol = h.GetValue()
				}
			}
			if !strings.HasSuffix(pol, ";"+tc.policy) || !strings.HasPrefix(limit, strconv.Itoa(int(rpu))+",") {
				t.Errorf("%s: rls's RateLimit-Policy %q (want %s) and Envoy's X-RateLimit-Limit %q disagree on the quota", tc.limit, pol, tc.policy, limit)
			}
			clock.Set(clock.Now().Add(400 * time.Millisecond))
		}
	}
}
