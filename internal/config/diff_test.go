package config

import (
	"reflect"
	"testing"
)

// TestDiff: a reload's changes, limit by limit: a raised limit is changed
// (with the fields that moved, not its place in the file), a new window
// added, a dropped node's limit removed, a limit that only moved in the
// file not listed; a first load lists every limit as added.
func TestDiff(t *testing.T) {
	old := parseString(t, `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 100}
`)
	new := parseString(t, `domain: api
descriptors:

  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 20, shadow_mode: true}
      - {unit: day, requests_per_unit: 1000}
`)
	for _, tc := range []struct {
		name     string
		old, new *Config
		want     []LimitChange
	}{
		{"reload", old, new, []LimitChange{
			{Domain: "api", Path: "user", Label: "user/1m", Change: "changed", Detail: "requests_per_unit: 10 → 20; shadow: (none) → true"},
			{Domain: "api", Path: "user", Label: "user/1d", Change: "added"},
			{Domain: "api", Path: "path=/login", Label: "path=/login/1s", Change: "removed"},
		}},
		{"first load", nil, old, []LimitChange{
			{Domain: "api", Path: "user", Label: "user/1m", Change: "added"},
			{Domain: "api", Path: "path=/login", Label: "path=/login/1s", Change: "added"},
			{Domain: "api", Path: "ip", Label: "ip/1h", Change: "added"},
		}},
		{"same", old, old, nil},
	} {
		if got := Diff(tc.old, tc.new); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Diff =\n%+v\nwant\n%+v", tc.name, got, tc.want)
		}
	}
}
