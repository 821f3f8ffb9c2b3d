package lease_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/redistest"
)

// TestTwoRLSProcesses runs two rls processes (the binary) on one Redis
// with a leased hot limit of 1000 a second, asked about eight times over
// through gRPC, and kills one with SIGKILL mid-run. Answers are counted by
// the second of the instant they came back, so a window's count may be off
// by the requests in flight at its edges (a few): the run as a whole never
// admits more than the limit per second it spanned, the whole seconds
// before the kill admit about the limit, and so do the whole seconds
// after it, from the survivor alone.
func TestTwoRLSProcesses(t *testing.T) {
	const limit = 1000
	srv := redistest.Start(t)
	cfg := fmt.Sprintf(`
domain: hot
descriptors:
  - key: tenant
    lease: true
    rate_limit: {unit: second, requests_per_unit: %d}
`, limit)
	procs := proctest.ServeN(t, 2, cfg, "--store", "redis", "--redis-url", srv.URL(), "--log-level", "warn", "--watch=false")
	var mu sync.Mutex
	perSecond := map[int64]int{}
	send := func(p *proctest.Served, stop <-chan struct{}, wg *sync.WaitGroup) {
		cc, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Error(err)
			return
		}
		client := rlsv3.NewRateLimitServiceClient(cc)
		req := &rlsv3.RateLimitRequest{Domain: "hot", Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}}
		for range 4 {
			wg.Go(func() {
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					resp, err := client.ShouldRateLimit(ctx, req)
					cancel()
					if err != nil {
						return // killed
					}
					if resp.OverallCode == rlsv3.RateLimitResponse_OK {
						mu.Lock()
						perSecond[time.Now().Unix()]++
						mu.Unlock()
					}
				}
			})
		}
		t.Cleanup(func() { cc.Close() })
	}
	// Start just after a second starts.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
	start := time.Now().Unix()
	stopA, stopB := make(chan struct{}), make(chan struct{})
	var wgA, wgB sync.WaitGroup
	send(procs[0], stopA, &wgA)
	send(procs[1], stopB, &wgB)
	time.Sleep(2500 * time.Millisecond)
	kill := time.Now().Unix()
	if err := procs[0].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	close(stopA)
	wgA.Wait()
	time.Sleep(2500 * time.Millisecond)
	close(stopB)
	wgB.Wait()
	end := time.Now().Unix()

	mu.Lock()
	defer mu.Unlock()
	total := 0
	for s := start; s <= end; s++ {
		total += perSecond[s]
		whole := s != start && s != kill && s != end
		t.Logf("second %d: %d admitted%s", s-start, perSecond[s], map[bool]string{true: "", false: " (not whole)"}[whole])
		if whole && (perSecond[s] < limit*85/100 || perSecond[s] > limit*105/100) {
			t.Errorf("second %d admitted %d, want about the limit %d", s-start, perSecond[s], limit)
		}
	}
	if spanned := int(end-start+1) * limit; total > spanned {
		t.Errorf("%d admitted over %d seconds: more than the limit per second", total, end-start+1)
	}
	m, err := proctest.Samples("http://" + procs[1].HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the survivor: %v slices taken, %v hits admitted from them, %v Redis scripts", m["rls_lease_slices_taken_total"], m["rls_lease_hits_local_total"], m["rls_redis_scripts_total"])
	if m["rls_lease_hits_local_total"] == 0 {
		t.Error("the survivor admitted no hit from a slice")
	}
}
