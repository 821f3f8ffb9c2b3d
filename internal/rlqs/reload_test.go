package rlqs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/service"
)

// TestGrantGivenBackToTheCounterThatPaidIt is the regression test of a
// give-back that landed on another counter after a reload: a grant taken
// from a limit of 1000 a minute, the limit changed to 1000 an hour while
// the grant was out, RLS clients spending the hour's 1000, then the
// client's report: whatever it gives back belongs to the minute's
// counter, so the hour's admits nothing more.
func TestGrantGivenBackToTheCounterThatPaidIt(t *testing.T) {
	clock := storetest.NewClock(storetest.T0.Add(time.Second))
	servers, _ := processes(t, 1, window{unit: "minute", limit: 1000}, clock)
	svc := servers[0].svc
	ss := servers[0].NewSession()
	ctx := context.Background()
	gpt := map[string]string{"model": "gpt"}

	// Step 1: the first report takes a grant from the minute's counter.
	resp, err := ss.Report(ctx, reportOf("llm", gpt, 1))
	if err != nil {
		t.Fatal(err)
	}
	if tb := tokenBucketOf(resp); tb == nil {
		t.Fatalf("step 1: report of model=gpt answered %v, want a token bucket", resp)
	}

	// Step 2: a reload makes the limit 1000 an hour.
	hour, err := config.Parse("llm.yaml", []byte(fmt.Sprintf(testConfig, "hour", 1000)))
	if err != nil {
		t.Fatal(err)
	}
	svc.SetConfig(hour)

	// Step 3: RLS clients spend the hour's counter.
	rls := func() int {
		n := 0
		for range 2000 {
			r, err := svc.ShouldRateLimit(ctx, &service.Request{Domain: "llm", Descriptors: []service.Descriptor{
				{Entries: []config.Entry{{Key: "model", Value: "gpt"}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Code != service.OK {
				break
			}
			n++
		}
		return n
	}
	clock.Set(storetest.T0.Add(2 * time.Second))
	before := rls()

	// Step 4: the client reports, having used nothing; step 5: RLS again.
	clock.Set(storetest.T0.Add(6 * time.Second))
	if _, err := ss.Report(ctx, reportOf("llm", gpt, 0)); err != nil {
		t.Fatal(err)
	}
	after := rls()
	t.Logf("the hour's counter admitted %d to RLS before the report, %d after it", before, after)
	if after != 0 {
		t.Errorf("step 5: %d RLS requests admitted on the hour's counter after the report (%d before it, the limit 1000): the grant taken from the minute's counter was given back to the hour's",
			after, before)
	}
}
