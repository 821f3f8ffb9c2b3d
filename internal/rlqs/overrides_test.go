package rlqs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/service"
)

// TestAssignmentsFollowOverrides: a bucket's assignments are sized by its
// limits as the runtime overrides make them, and paid under them: a raise
// lets a client that asks more than the configured limit be assigned more
// (a client asking 500 a second of a limit of 100 a second is assigned
// 100 a second at most without the override, more with it), and 0 denies
// it.
func TestAssignmentsFollowOverrides(t *testing.T) {
	clock := storetest.NewClock(storetest.T0.Add(time.Second))
	cfg, err := config.Parse("llm.yaml", []byte(fmt.Sprintf(testConfig, "second", 100)))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(func() { store.Close() })
	mem, err := overrides.NewMemory("", clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	keep := overrides.New(mem, overrides.Options{Now: clock.Now})
	svc := service.New(service.Options{Store: store, Overrides: keep})
	svc.SetConfig(cfg)
	srv := New(svc, Options{Now: clock.Now})
	ss := srv.NewSession()
	ctx := context.Background()
	gpt := map[string]string{"model": "gpt"}
	set := func(rpu uint32) {
		t.Helper()
		c := overrides.Change{Key: overrides.Key{Domain: "llm", Descriptor: []engine.Entry{{Key: "model", Value: "gpt"}}}, RequestsPerUnit: rpu}
		if _, err := keep.Set(ctx, c, "test"); err != nil {
			t.Fatal(err)
		}
	}
	// rate reports allowed and denied requests a second after the last
	// report and returns the fill rate of the token bucket assigned (0 for
	// none).
	rate := func(step int, allowed, denied uint64) float64 {
		t.Helper()
		clock.Set(clock.Now().Add(time.Second))
		r := reportOf("llm", gpt, allowed)
		r.BucketQuotaUsages[0].NumRequestsDenied = denied
		resp, err := ss.Report(ctx, r)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		tb := tokenBucketOf(resp)
		if tb == nil {
			return 0
		}
		return float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
	}
	rate(1, 0, 0) // the first report: a guess
	if got := rate(2, 100, 400); got > 100 {
		t.Fatalf("step 2: a client asking 500/s of 100/s assigned %.0f/s: want at most the limit (the test's premise)", got)
	}
	set(1000)
	got := rate(3, 100, 400)
	t.Logf("raised to 1000/s: a client asking 500/s is assigned %.0f/s", got)
	if got <= 100 {
		t.Errorf("step 3: raised to 1000/s, a client asking 500/s assigned %.0f/s; want more than the configured 100/s", got)
	}
	set(0)
	clock.Set(clock.Now().Add(time.Minute)) // a new window: nothing paid in it yet
	if got := rate(4, 100, 400); got != 0 {
		t.Errorf("step 4: blocked by an override of 0: assigned %.0f/s, want DENY_ALL", got)
	}
}
