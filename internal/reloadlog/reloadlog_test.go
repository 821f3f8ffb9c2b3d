package reloadlog

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
)

// TestLog: loads as the service reports them (ForConfig then Reloaded(nil),
// or Reloaded(err) alone), newest first, each with its time and the
// changes from the config before it, a failed one with its error and the
// config that stayed; only the last keep are kept.
func TestLog(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0
	log := New(2, func() time.Time { return now })
	parse := func(text string) *config.Config {
		t.Helper()
		c, err := config.Parse("l.yaml", []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := parse("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	b := parse("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")

	log.ForConfig(a)
	log.Reloaded(nil)
	now = t0.Add(time.Minute)
	log.Reloaded(errors.New("l.yaml:3:5: bad"))
	now = t0.Add(2 * time.Minute)
	log.ForConfig(b)
	log.Reloaded(nil)

	got := log.Loads()
	if len(got) != 2 {
		t.Fatalf("Loads() = %d loads, want the last 2: %+v", len(got), got)
	}
	if l := got[0]; !l.Time.Equal(t0.Add(2*time.Minute)) || l.Error != "" || l.Limits != 1 || len(l.Changes) != 1 ||
		l.Changes[0].Change != "changed" || l.Changes[0].Detail != "requests_per_unit: 1 → 2" {
		t.Errorf("newest load = %+v, want at t0+2m, 1 limit, requests_per_unit: 1 → 2", l)
	}
	if l := got[1]; !l.Time.Equal(t0.Add(time.Minute)) || l.Error != "l.yaml:3:5: bad" || l.Changes != nil || l.Domains != 1 {
		t.Errorf("older load = %+v, want the failure at t0+1m, the 1 domain that stayed, no changes", l)
	}
}

// TestLogBoundsChanges: a load of a big config keeps MaxChanges of its
// changes and counts the others, so that 20 loads of 100,000 limits do
// not hold millions of changes.
func TestLogBoundsChanges(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range MaxChanges + 50 {
		fmt.Fprintf(&b, "  - key: k\n    value: v%d\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
	}
	cfg, err := config.Parse("big.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	log := New(0, nil)
	log.ForConfig(cfg)
	log.Reloaded(nil)
	if got := log.Loads()[0]; len(got.Changes) != MaxChanges || got.MoreChanges != 50 || got.Limits != MaxChanges+50 {
		t.Errorf("first load of %d limits: %d changes kept, %d more, %d limits; want %d, 50, %d",
			MaxChanges+50, len(got.Changes), got.MoreChanges, got.Limits, MaxChanges, MaxChanges+50)
	}
}
