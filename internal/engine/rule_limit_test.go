package engine

import (
	"strings"
	"testing"
	"time"
)

// TestWithLimit: a rule given another limit (a runtime override) keeps
// everything but its limit and burst, its counter identity first; the
// new values are checked as the config's are.
func TestWithLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spec      Spec
		limit     uint32
		burst     Opt[uint32]
		wantBurst uint32
		wantErr   string // the field: message, when refused
	}{
		{"fixed window raised", Spec{Unit: Minute, Multiplier: 1, Limit: 10}, 20, Opt[uint32]{}, 0, ""},
		{"fixed window blocked", Spec{Unit: Minute, Multiplier: 5, Limit: 10, Name: "daily"}, 0, Opt[uint32]{}, 0, ""},
		{"a burst on a fixed window", Spec{Unit: Minute, Multiplier: 1, Limit: 10}, 20, Some[uint32](5), 0, "burst: burst is only for algorithm token_bucket"},
		{"token bucket, burst by default its limit", Spec{Algorithm: TokenBucket, Unit: Second, Multiplier: 1, Limit: 5, Burst: Some[uint32](50)}, 40, Opt[uint32]{}, 40, ""},
		{"token bucket, a burst given", Spec{Algorithm: TokenBucket, Unit: Second, Multiplier: 1, Limit: 5}, 40, Some[uint32](400), 400, ""},
		{"token bucket, burst 0", Spec{Algorithm: TokenBucket, Unit: Second, Multiplier: 1, Limit: 5}, 40, Some[uint32](0), 0, "burst: burst must be at least 1"},
		{"token bucket, more than one per microsecond", Spec{Algorithm: TokenBucket, Unit: Second, Multiplier: 1, Limit: 5}, 2_000_000, Opt[uint32]{}, 0, "requests_per_unit: requests_per_unit 2000000 per 1 second"},
		{"sliding log past its bound", Spec{Algorithm: SlidingLog, Unit: Minute, Multiplier: 1, Limit: 5}, MaxSlidingLog + 1, Opt[uint32]{}, 0, "requests_per_unit: requests_per_unit 100001 is too large"},
		{"calendar window", Spec{Unit: Month, Multiplier: 1, Limit: 3, Calendar: true, TimeZone: Some("Europe/Paris")}, 30, Opt[uint32]{}, 0, ""},
		{"concurrency", Spec{Algorithm: Concurrency, Unit: Second, Multiplier: 1, Limit: 2, LeaseTTL: Some(30 * time.Second), Name: "uploads"}, 8, Opt[uint32]{}, 0, ""},
		{"leased", Spec{Unit: Minute, Multiplier: 1, Limit: 10, Lease: true}, 3, Opt[uint32]{}, 0, ""},
		{"with a penalty", Spec{Unit: Minute, Multiplier: 1, Limit: 10, Penalty: []time.Duration{time.Minute}}, 3, Opt[uint32]{}, 0, ""},
	} {
		r := MustCompile(tc.spec)
		got, errs := r.WithLimit(tc.limit, tc.burst)
		if tc.wantErr != "" {
			if len(errs) == 0 || !strings.HasPrefix(errs[0].Error(), tc.wantErr) {
				t.Errorf("%s: WithLimit(%d, %v) = %v, want %q", tc.name, tc.limit, tc.burst, errs, tc.wantErr)
			}
			continue
		}
		if len(errs) > 0 {
			t.Errorf("%s: WithLimit(%d, %v): %v", tc.name, tc.limit, tc.burst, errs)
			continue
		}
		if got.ID != r.ID || got.Window != r.Window || got.Calendar.String() != r.Calendar.String() || got.Code() != r.Code() || got.Lease != r.Lease || len(got.Penalty) != len(r.Penalty) {
			t.Errorf("%s: %+v, want %+v but for its limit", tc.name, got, r)
		}
		if got.Limit != tc.limit || got.Burst != tc.wantBurst {
			t.Errorf("%s: limit %d burst %d, want %d and %d", tc.name, got.Limit, got.Burst, tc.limit, tc.wantBurst)
		}
	}
}
