package decisionmetrics

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestLimitValueGauges: each limit's configured value and window are
// exported beside its rls_decisions_total series, by the same labels:
// from its first decision on, kept by a reload that keeps the limit (with
// the new config's values), gone with a reload that drops it; limits that
// share a name show the first one's values; unlimited limits none.
func TestLimitValueGauges(t *testing.T) {
	f := newMetricsFixture(t, 0)
	const limits = `domain: d
descriptors:
  - key: b
    rate_limit: {unit: second, requests_per_unit: %d, algorithm: token_bucket, burst: 20}
  - key: cc
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: concurrency, lease_ttl: 30s}
  - key: s1
    rate_limit: {unit: hour, requests_per_unit: 7, name: shared}
  - key: s2
    rate_limit: {unit: day, requests_per_unit: 9, name: shared}
  - key: u
    rate_limit: {unlimited: true}
  - key: idle
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	const a = "  - key: a\n    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 10}\n"
	steps := []struct {
		do               func()
		what             string
		perUnit, windows []string
	}{
		{func() { f.load(t, fmt.Sprintf(limits, 5)+a) }, "load", nil, nil},
		{func() {
			for _, k := range []string{"a", "b", "cc", "s2", "u"} {
				f.ask(t, "d", k, "x")
			}
		}, "a decision on a, b, cc, s2 (shared) and u (unlimited)",
			[]string{"domain=d,limit=a/5m 10", "domain=d,limit=b/1s 5", "domain=d,limit=cc/concurrency 2", "domain=d,limit=shared 7"},
			[]string{"domain=d,limit=a/5m 300", "domain=d,limit=b/1s 1", "domain=d,limit=cc/concurrency 30", "domain=d,limit=shared 3600"}},
		{func() { f.load(t, fmt.Sprintf(limits, 50)) }, "a reload without a, b at 50",
			[]string{"domain=d,limit=b/1s 50", "domain=d,limit=cc/concurrency 2", "domain=d,limit=shared 7"},
			[]string{"domain=d,limit=b/1s 1", "domain=d,limit=cc/concurrency 30", "domain=d,limit=shared 3600"}},
	}
	for i, st := range steps {
		st.do()
		if got := f.series(t, "rls_limit_requests_per_unit"); !slices.Equal(got, st.perUnit) {
			t.Errorf("step %d (%s): rls_limit_requests_per_unit\n\t%s\nwant\n\t%s", i+1, st.what, strings.Join(got, "\n\t"), strings.Join(st.perUnit, "\n\t"))
		}
		if got := f.series(t, "rls_limit_window_seconds"); !slices.Equal(got, st.windows) {
			t.Errorf("step %d (%s): rls_limit_window_seconds\n\t%s\nwant\n\t%s", i+1, st.what, strings.Join(got, "\n\t"), strings.Join(st.windows, "\n\t"))
		}
	}
}
