package config

import (
	"fmt"
	"testing"
)

// TestPathEntries: a node's path as entries, level by level from the top,
// with "" for a level of any value; Path says the same in text.
func TestPathEntries(t *testing.T) {
	cfg, err := Parse("t.yaml", []byte(`
domain: d
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user
        descriptors:
          - key: path
            value: "/api/*"
            rate_limit: {unit: minute, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.Domain("d").Descriptors[0].Children[0].Children[0]
	want := []Entry{{Key: "tenant", Value: "acme"}, {Key: "user"}, {Key: "path", Value: "/api/*"}}
	if got := n.PathEntries(); fmt.Sprint(got) != fmt.Sprint(want) || n.Path != "tenant=acme/user/path=/api/*" {
		t.Errorf("PathEntries() of %s = %v, want %v", n.Path, got, want)
	}
	var none *Descriptor
	if got := none.PathEntries(); got == nil || len(got) != 0 {
		t.Errorf("(*Descriptor)(nil).PathEntries() = %#v, want an empty slice", got)
	}
}
