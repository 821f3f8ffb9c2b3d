package ruletest

import (
	"bytes"
	"testing"

	"github.com/rlsproject/rls/internal/config"
)

// TestConcurrencyTimeline: a limit of requests in flight as rls test
// writes it: hits acquire, refund: true releases, a lost release's slot
// comes back lease_ttl after its acquisition, and a failing step shows
// the limit by its label.
func TestConcurrencyTimeline(t *testing.T) {
	cfg, err := config.Parse("limits.yaml", []byte(`
domain: api
descriptors:
  - key: job
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: concurrency, lease_ttl: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse("t.yaml", []byte(`
domain: api
tests:
  - name: two in flight
    steps:
      - {descriptors: [job=build], repeat: 2, expect: OK, statuses: [{limit: job/concurrency, remaining: 0, reset: 60s}]}
      - {at: 10s, descriptors: [job=build], expect: OVER_LIMIT, statuses: [{code: OVER_LIMIT, reset: 50s}], headers: {Retry-After: "50"}}
      - {descriptors: [{entries: job=build, refund: true}], expect: OK, statuses: [{remaining: 1}]}
      - {descriptors: [job=build], expect: OK}
      - {at: 60s, descriptors: [job=build], expect: OK, statuses: [{remaining: 0, reset: 10s}]}
      - {at: 70s, descriptors: [job=build], expect: OK, statuses: [{remaining: 0, reset: 50s}]}
  - name: wrongly hopes for three
    steps:
      - {descriptors: [job=build], repeat: 3, expect: OK}
`))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	passed, failed := Run(cfg, f, &out)
	want := "PASS two in flight\n" +
		"FAIL wrongly hopes for three: step 1: got OVER_LIMIT, want OK; statuses[0]: OVER_LIMIT job/concurrency remaining 0 reset 1m0s (request 3 of 3, at +0s)\n"
	if out.String() != want || passed != 1 || failed != 1 {
		t.Errorf("Run = %d passed, %d failed:\n%s\nwant:\n%s", passed, failed, out.String(), want)
	}
}
