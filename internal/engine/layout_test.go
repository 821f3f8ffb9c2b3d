package engine

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/keys.golden from what the code builds")

// TestKeyLayout holds the key layout (key.go) to testdata/keys.golden: the
// identity of descriptors, rules and counters, and the keys a store that
// keys counters by string derives from them. A change of any of them is a
// data migration (the counters under the old keys are forgotten, and
// processes of two versions sharing a store count apart): it must show in
// the golden file's diff. go test -run TestKeyLayout -update rewrites it.
func TestKeyLayout(t *testing.T) {
	descs := []struct {
		domain  string
		entries []Entry
		shares  []string
	}{
		{"api", []Entry{{"remote_address", "203.0.113.7"}}, nil},
		{"api", []Entry{{"api_key", "k1"}, {"path", "/v1/users?x={y}"}}, nil},
		{"d", []Entry{{"a_b", "c"}}, nil},
		{"d", []Entry{{"a", "b_c"}}, nil},
		{"d", []Entry{{"path", "/api/a"}, {"method", "GET"}}, []string{"/api/*", ""}},
		{"d", []Entry{{"k", "a b%\x00é"}}, nil},
		{"d", []Entry{{"k", strings.Repeat("x", 65)}}, nil},
		{"d", []Entry{{"k", ""}}, nil},
	}
	specs := []Spec{
		{Unit: Second, Multiplier: 1, Limit: 10},
		{Unit: Second, Multiplier: 1, Limit: 10, Lease: true},                           // the same counter: a lease is not part of it
		{Unit: Second, Multiplier: 1, Limit: 10, Penalty: []time.Duration{time.Minute}}, // the same counter: nor is a penalty
		{Unit: Minute, Multiplier: 5, Limit: 10},
		{Algorithm: SlidingWindow, Unit: Hour, Multiplier: 1, Limit: 240},
		{Algorithm: SlidingLog, Unit: Minute, Multiplier: 1, Limit: 5, Name: "burst"},
		{Algorithm: TokenBucket, Unit: Second, Multiplier: 1, Limit: 50, Burst: Some[uint32](100)},
		{Unit: Month, Multiplier: 1, Limit: 3},
		{Unit: Month, Multiplier: 1, Limit: 3, Calendar: true, TimeZone: Some("Europe/Paris")},
		{Unit: Day, Multiplier: 1, Limit: 3, Calendar: true, Name: "ünï:{x}"},
		{Algorithm: Concurrency, Unit: Second, Multiplier: 1, Limit: 10, LeaseTTL: Some(30 * time.Second)},
		{Algorithm: Concurrency, Unit: Minute, Multiplier: 1, Limit: 5, LeaseTTL: Some(time.Minute), Name: "uploads"},
	}
	var b strings.Builder
	b.WriteString("# descriptor identities (AppendDescriptorKey)\n")
	var ids []string
	for _, d := range descs {
		id := string(AppendDescriptorKey(nil, d.domain, d.entries, d.shares))
		ids = append(ids, id)
		fmt.Fprintf(&b, "%q %q shares %q\n\t%s\n", d.domain, d.entries, d.shares, id)
	}
	fmt.Fprintf(&b, "\n# the descriptor key (DescriptorKey, prefix rls:) of the first descriptor\n%s\n", DescriptorKey("rls:", ids[0]))
	b.WriteString("\n# rule identities (Rule.ID) and counter keys (CounterKey, prefix rls:) of the first descriptor\n")
	for _, s := range specs {
		r := MustCompile(s)
		fmt.Fprintf(&b, "%+v\n\t%s\n\t%s\n", s, r.ID, CounterKey("rls:", ids[0], r))
	}
	over, errs := MustCompile(specs[6]).WithLimit(500, Some[uint32](50))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	fmt.Fprintf(&b, "\n# a runtime override of the token bucket above (WithLimit 500, burst 50): the same counter\n\t%s\n\t%s\n", over.ID, CounterKey("rls:", ids[0], over))
	fmt.Fprintf(&b, "\n# the rest\nunlimited %q\nfreed channel %q\n", UnlimitedID("vip"), FreedChannel("rls:"))
	fmt.Fprintf(&b, "overrides hash %q version %q channel %q\n", OverridesKey("rls:"), OverridesVersionKey("rls:"), OverridesChannel("rls:"))
	fmt.Fprintf(&b, "override fields %q %q\n", OverrideField("api", []Entry{{"tenant", "acme-*"}}, ""), OverrideField("api", []Entry{{"tenant", "acme"}, {"path", "/v1"}}, "daily"))
	got := b.String()
	const golden = "testdata/keys.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test -run TestKeyLayout -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("the key layout changed: a change of keys is a data migration (counters under the old keys are forgotten).\nIf it is meant, say so in the CHANGELOG and run go test -run TestKeyLayout -update.\ngot:\n%s\nwant:\n%s", got, want)
	}
}
