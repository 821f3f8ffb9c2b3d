package config

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

const explainConfig = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
  - key: api_key
    value: team-*
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: acme
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 1000}
      - key: plan
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    descriptors:
      - key: path
        descriptors:
          - key: method
            value: GET
            rate_limit: {unit: minute, requests_per_unit: 5}
`

// TestExplainReasons: one case per way a match ends, with what the trace
// says about it.
func TestExplainReasons(t *testing.T) {
	d := parseString(t, explainConfig).Domain("api")
	tests := []struct {
		name    string
		dom     *Domain
		entries []Entry
		stop    Stop
		at      int
		path    string   // the node reached, or the parent where it stopped
		hows    []string // how each matched level matched
		keys    []string // NoNodeForKey
		cands   []string // ValueNotMatched: candidate paths
	}{
		{name: "matched any value", dom: d, entries: entries("remote_address", "10.0.0.1"),
			stop: Matched, path: "remote_address", hows: []string{"any_value"}},
		{name: "matched exact then any value", dom: d, entries: entries("tenant", "acme", "plan", "silver"),
			stop: Matched, path: "tenant=acme/plan", hows: []string{"exact", "any_value"}},
		{name: "matched a wildcard", dom: d, entries: entries("api_key", "team-blue"),
			stop: Matched, path: "api_key=team-*", hows: []string{"wildcard"}},
		{name: "unknown domain", dom: nil, entries: entries("remote_address", "x"), stop: UnknownDomain},
		{name: "no entries", dom: d, entries: nil, stop: NoEntries},
		{name: "no node for the key at the top", dom: d, entries: entries("remote_addr", "10.0.0.1"),
			stop: NoNodeForKey, at: 0, keys: []string{"remote_address", "api_key", "tenant", "user"}},
		{name: "no node for the key below", dom: d, entries: entries("user", "u1", "method", "GET"),
			stop: NoNodeForKey, at: 1, path: "user", hows: []string{"any_value"}, keys: []string{"path"}},
		{name: "value not matched", dom: d, entries: entries("api_key", "guest"),
			stop: ValueNotMatched, at: 0, cands: []string{"api_key=internal", "api_key=team-*"}},
		{name: "value not matched below", dom: d, entries: entries("user", "u1", "path", "/x", "method", "POST"),
			stop: ValueNotMatched, at: 2, path: "user/path", hows: []string{"any_value", "any_value"}, cands: []string{"user/path/method=GET"}},
		{name: "deeper than the config", dom: d, entries: entries("remote_address", "10.0.0.1", "path", "/x"),
			stop: DeeperThanConfig, at: 1, path: "remote_address", hows: []string{"any_value"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := tc.dom.Explain(tc.entries)
			call := fmt.Sprintf("Explain(%v)", tc.entries)
			if tr.Stop != tc.stop {
				t.Fatalf("%s stopped %s, want %s", call, tr.Stop, tc.stop)
			}
			if got := tc.dom.Match(tc.entries); got != tr.Node {
				t.Errorf("%s node %v, Match gives %v", call, tr.Node, got)
			}
			var path string
			switch {
			case tr.Node != nil:
				path = tr.Node.Path
			case tr.Parent != nil:
				path = tr.Parent.Path
			}
			if path != tc.path {
				t.Errorf("%s at %q, want %q", call, path, tc.path)
			}
			if tc.stop != Matched && tr.At != tc.at {
				t.Errorf("%s stopped at entry %d, want %d", call, tr.At, tc.at)
			}
			var hows []string
			for _, s := range tr.Steps {
				hows = append(hows, s.How.String())
			}
			if !reflect.DeepEqual(hows, tc.hows) {
				t.Errorf("%s steps %v, want %v", call, hows, tc.hows)
			}
			if !reflect.DeepEqual(tr.Keys, tc.keys) {
				t.Errorf("%s keys %q, want %q", call, tr.Keys, tc.keys)
			}
			var cands []string
			for _, c := range tr.Candidates {
				cands = append(cands, c.Path)
			}
			if !reflect.DeepEqual(cands, tc.cands) {
				t.Errorf("%s candidates %q, want %q", call, cands, tc.cands)
			}
		})
	}
}

// TestExplainAgreesWithMatch: on random descriptors over the keys and
// values of a config, Explain reaches the node Match returns, and when it
// stops, Match returns nil.
func TestExplainAgreesWithMatch(t *testing.T) {
	d := parseString(t, explainConfig).Domain("api")
	keys := []string{"remote_address", "api_key", "tenant", "plan", "user", "path", "method", "x"}
	values := []string{"10.0.0.1", "internal", "team-a", "team-", "acme", "gold", "GET", "POST", "u", ""}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		n := rng.IntN(5)
		es := make([]Entry, n)
		for i := range es {
			es[i] = Entry{Key: keys[rng.IntN(len(keys))], Value: values[rng.IntN(len(values))]}
		}
		tr := d.Explain(es)
		if got := d.Match(es); got != tr.Node || (got == nil) != (tr.Stop != Matched) {
			t.Fatalf("Explain(%v) = node %v stop %s; Match = %v", es, tr.Node, tr.Stop, got)
		}
		if tr.Stop == Matched && len(tr.Steps) != n {
			t.Fatalf("Explain(%v) matched with %d steps for %d entries", es, len(tr.Steps), n)
		}
	}
}

func TestExplainBoundsCandidates(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: many\ndescriptors:\n")
	for i := range MaxCandidates + 5 {
		fmt.Fprintf(&b, "  - key: k\n    value: v%d\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
		fmt.Fprintf(&b, "  - key: key%d\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
	}
	d := parseString(t, b.String()).Domain("many")
	if tr := d.Explain(entries("k", "nope")); len(tr.Candidates) != MaxCandidates || tr.More != 5 {
		t.Errorf("value not matched among %d values: %d candidates, %d more; want %d and 5", MaxCandidates+5, len(tr.Candidates), tr.More, MaxCandidates)
	}
	if tr := d.Explain(entries("nope", "x")); len(tr.Keys) != MaxCandidates || tr.More != MaxCandidates+6-MaxCandidates {
		t.Errorf("no node among %d keys: %d keys, %d more; want %d and %d", MaxCandidates+6, len(tr.Keys), tr.More, MaxCandidates, 6)
	}
}
