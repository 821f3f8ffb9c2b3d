package config

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// TestConcurrency: algorithm: concurrency with lease_ttl compiles into a
// rule whose window is the lease_ttl; its label and the dump say
// "concurrency" and the lease_ttl rather than a window its unit does not
// make; two of them on one descriptor need names, as two limits of one
// identity do. (A rate limit beside one is refused: testdata/bad.)
func TestConcurrency(t *testing.T) {
	cfg, err := Parse("cc.yaml", []byte(`
domain: api
descriptors:
  - key: tenant
    count_denied_hits: true
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: concurrency, lease_ttl: 30s}
      - {unit: second, requests_per_unit: 20, algorithm: concurrency, lease_ttl: 1m, name: long}
  - key: upload
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency, lease_ttl: 1m30s, name: uploads}
`))
	if err != nil {
		t.Fatal(err)
	}
	ls := cfg.Domain("api").Match([]Entry{{Key: "tenant", Value: "a"}}).Limits
	cc := ls[0]
	if cc.Rule.Algorithm() != engine.Concurrency || cc.Rule.Window != 30*time.Second || cc.ID() != "cc" || cc.Label != "tenant/concurrency" || !cc.CountDeniedHits {
		t.Errorf("concurrency limit: algorithm %s window %s ID %q label %q count denied %v; want concurrency 30s cc tenant/concurrency true",
			cc.Rule.Algorithm(), cc.Rule.Window, cc.ID(), cc.Label, cc.CountDeniedHits)
	}
	if ls[1].Label != "long" {
		t.Errorf("the named concurrency limit beside it: label %q, want long", ls[1].Label)
	}
	var b bytes.Buffer
	if err := cfg.WriteJSON(&b, 0); err != nil {
		t.Fatal(err)
	}
	dump := b.String()
	for _, want := range []string{`"algorithm": "concurrency"`, `"lease_ttl": "30s"`, `"lease_ttl": "1m30s"`, `"id": "cc:7:uploads"`} {
		if !strings.Contains(dump, want) {
			t.Errorf("the dump has no %s:\n%s", want, dump)
		}
	}
	if strings.Contains(dump, `"window": "concurrency"`) {
		t.Errorf("the dump gives a concurrency limit a window:\n%s", dump)
	}

	_, err = Parse("dup.yaml", []byte(`
domain: api
descriptors:
  - key: tenant
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: concurrency, lease_ttl: 30s}
      - {unit: minute, requests_per_unit: 5, algorithm: concurrency, lease_ttl: 1m}
`))
	if want := `dup.yaml:7:10: descriptor "tenant": duplicate limit cc`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("two unnamed concurrency limits on one descriptor: %v, want %q", err, want)
	}
}
