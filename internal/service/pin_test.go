package service

import (
	"context"
	"errors"
	"testing"

	"github.com/rlsproject/rls/internal/config"
)

// TestRequestPinnedToAConfig: a request pinned to the config it was made
// for is decided while that config is current, and not at all once a
// reload has replaced it (ErrConfigChanged, nothing counted): hits given
// back after a reload must not land on the new config's counters.
func TestRequestPinnedToAConfig(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	old := f.svc.Config()
	req := func(pin *config.Config, hits uint64, refund bool) (*Response, error) {
		d := desc("user", "u1")
		d.HasHits, d.Hits, d.Refund = true, hits, refund
		return f.svc.ShouldRateLimit(ctx, &Request{Domain: "api", Config: pin, Descriptors: []Descriptor{d}})
	}
	// Step 1: pinned to the current config, decided: 10 of user's 10 a minute.
	if resp, err := req(old, 10, false); err != nil || resp.Code != OK {
		t.Fatalf("step 1: 10 hits pinned to the current config: %v, %v; want OK", resp, err)
	}
	// Step 2: a reload (the same file, a new config).
	cfg, err := config.Parse("test.yaml", []byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetConfig(cfg)
	// Step 3: a give-back pinned to the old config is not decided.
	if _, err := req(old, 10, true); !errors.Is(err, ErrConfigChanged) {
		t.Errorf("step 3: a refund pinned to the replaced config: %v, want ErrConfigChanged", err)
	}
	// Step 4: so the counter still holds the 10 hits.
	if resp, err := req(nil, 1, false); err != nil || resp.Code != OverLimit {
		t.Errorf("step 4: one more hit, unpinned: %v, %v; want OVER_LIMIT (the refund of step 3 counted nothing)", resp, err)
	}
}
