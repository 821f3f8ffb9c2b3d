package ui

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestFlags: the fields of a limit the page has no column for are shown
// as flags: true ones by name, objects (reserve, say) field by field.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		json string
		want []string
	}{
		{`{"unit": "minute", "lease": true}`, []string{"lease"}},
		{`{"lease": false, "shadow_mode": null}`, nil},
		{`{"reserve": {"ttl": "5m0s", "estimate": 4000}}`, []string{"reserve: estimate 4000, ttl 5m0s"}},
		{`{"penalty": ["1m0s", "10m0s"], "lease": true}`, []string{"lease", "penalty: 1m0s, 10m0s"}},
	} {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(tc.json), &m); err != nil {
			t.Fatal(err)
		}
		if got := flags(m, []string{"unit"}); !slices.Equal(got, tc.want) {
			t.Errorf("flags(%s) = %q, want %q", tc.json, got, tc.want)
		}
	}
}
