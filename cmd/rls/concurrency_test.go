package main

import (
	"testing"

	"github.com/rlsproject/rls/internal/httpapi"
)

// TestExplainConcurrencyLine: rls explain shows a concurrency limit as the
// requests it lets in flight and its lease_ttl, not as a rate per its
// unit, which means nothing there.
func TestExplainConcurrencyLine(t *testing.T) {
	l := httpapi.LimitExplanation{
		Label: "job/concurrency", RequestsPerUnit: 2, Unit: "second", UnitMultiplier: 1, Window: "1m0s",
		Algorithm: "concurrency", LeaseTTL: "1m0s", Applies: "enforced",
		State: &httpapi.LimitState{Remaining: 1, Reset: "30s", Admits: true},
	}
	want := "job/concurrency              2 in flight concurrency lease_ttl 1m0s enforced: remaining 1, reset 30s"
	if got := limitLine(l); got != want {
		t.Errorf("limitLine =\n%q\nwant\n%q", got, want)
	}
}
