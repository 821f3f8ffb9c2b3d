//go:build saturation

// Package saturation holds the test of rls at saturation: two rls
// processes on one Redis (or one Redis Cluster), more closed-loop clients
// than the machine has cores, at the default store timeout, must answer
// all but a rare request (maxErrorShare, and one stall's calls in
// flight), and count each exactly once.
// The load is the point, so the test needs the machine to itself: `make
// test` runs it alone, after the other packages, without the race
// detector (`make saturation`).
package saturation

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
)

// One key whose three windows are never reached in a run, and one whose
// hour limit is: every answer counts, and the second key's admissions must
// be exactly its limit.
const config = `domain: sat
descriptors:
  - key: open
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
  - key: capped
    rate_limits:
      - {unit: hour, requests_per_unit: 5000}
      - {unit: minute, requests_per_unit: 1000000000, algorithm: sliding_window}
`

const (
	clients  = 64
	duration = 5 * time.Second
	capped   = 5000
	// maxErrorShare: at most one call in this many may fail, beside the
	// host's stalls. A host with more runnable work than cores can leave
	// Redis (or an rls) without a core for longer than the wait, and then
	// the calls in flight fail at once: seen here in about one run of
	// five, 6 to 34 calls of some 55,000 in one to three bursts, builds
	// before this change alike. So up to maxStalls bursts of at most
	// clients calls each are allowed on top; failures spread over the run
	// (the audit's 115 of 42,397, requests that reached Redis late) are
	// not bursts and still fail the test.
	maxErrorShare = 10000
	// maxStalls: one stall in every two seconds of the run.
	maxStalls = 3
)

// TestSaturationOneRedis: the audit's reproduction (two processes, 64
// clients, 5 s, default --store-timeout), with a busy process beside them
// standing for the rest of a loaded host.
func TestSaturationOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	saturate(t, true, "--redis-url", srv.URL())
}

// TestSaturationCluster: the same on a Redis Cluster of three masters,
// without the busy process: the audit's reproduction on a cluster (22 to
// 89 errors on an idle machine). Three Redis processes, two rls, the
// clients and a spinner on two cores stall some process for longer than
// the wait several times in 5 s (4 bursts, 46 calls, in 1 run of 6).
func TestSaturationCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	saturate(t, false, "--redis-cluster", strings.Join(c.Seeds(), ","))
}

// saturate runs the clients against two rls processes on store, with a
// process spinning on a core beside them when spin is set.
func saturate(t *testing.T, spin bool, store ...string) {
	bin := proctest.RLSBinary(t)
	var addrs []string
	for range 2 {
		s, err := proctest.Serve(proctest.Options{}, bin, config, append([]string{"--store", "redis"}, store...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop() })
		addrs = append(addrs, s.GRPCAddr)
	}
	var conns []rlsv3.RateLimitServiceClient
	for i := range 8 {
		conns = append(conns, rlsv3.NewRateLimitServiceClient(servetest.Dial(t, addrs[i%2])))
	}
	if spin {
		busy(t)
	}

	// The capped key's hour must not turn during the run (it would admit
	// its limit twice): wait the few seconds out when it is that close.
	if untilHour := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); untilHour < duration+2*time.Second {
		time.Sleep(untilHour + time.Second)
	}
	var mu sync.Mutex
	errs := map[string]int{}
	var errTimes []time.Time
	var calls, admittedCapped, cappedCalls, cappedFailed int
	end := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			cl := conns[w%len(conns)]
			key := "open"
			if w%4 == 0 {
				key = "capped"
			}
			req := &rlsv3.RateLimitRequest{Domain: "sat", Descriptors: []*commonv3.RateLimitDescriptor{{
				Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: "v"}},
			}}}
			n, admitted, failed := 0, 0, 0
			local := map[string]int{}
			var localTimes []time.Time
			for time.Now().Before(end) {
				// Envoy's shipped timeout (envoy/envoy.yaml): rls's budget
				// is its own store timeout.
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				resp, err := cl.ShouldRateLimit(ctx, req)
				cancel()
				n++
				switch {
				case err != nil:
					failed++
					local[status.Convert(err).Message()]++
					localTimes = append(localTimes, time.Now())
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					admitted++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			calls += n
			if key == "capped" {
				cappedCalls += n
				admittedCapped += admitted
				cappedFailed += failed
			}
			for m, k := range local {
				errs[m] += k
			}
			errTimes = append(errTimes, localTimes...)
		})
	}
	wg.Wait()

	failed := 0
	var lines []string
	for m, n := range errs {
		failed += n
		lines = append(lines, fmt.Sprintf("%6d %s", n, m))
	}
	sort.Strings(lines)
	bursts := errorBursts(errTimes)
	t.Logf("%d calls in %v (%d on the capped key, %d admitted), %d errors in bursts of %v", calls, duration, cappedCalls, admittedCapped, failed, bursts)
	// Up to maxStalls bursts of at most clients calls (a stall: the calls
	// in flight), and beside them one call in maxErrorShare.
	allowed := calls / maxErrorShare
	for _, n := range bursts[:min(maxStalls, len(bursts))] {
		if n <= clients {
			allowed += n
		}
	}
	if failed > allowed {
		t.Errorf("%d of %d calls failed in bursts of %v, want at most one in %d beside %d bursts of at most %d:\n%s", failed, calls, bursts, maxErrorShare, maxStalls, clients, strings.Join(lines, "\n"))
	}
	// Every hit admitted counted once: the capped key admits its limit
	// exactly, less what failed calls may have consumed unanswered.
	if cappedCalls-cappedFailed > capped && (admittedCapped > capped || admittedCapped < capped-cappedFailed) {
		t.Errorf("the capped key admitted %d of %d calls (%d failed), want its limit %d", admittedCapped, cappedCalls, cappedFailed, capped)
	}
}

// errorBursts groups the instants of failed calls into bursts (failures
// less than 100 ms apart: Envoy's timeout, the most a call in flight
// waits) and returns their sizes.
// The sizes come largest first.
func errorBursts(at []time.Time) (sizes []int) {
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	for i, t := range at {
		if i == 0 || t.Sub(at[i-1]) >= 100*time.Millisecond {
			sizes = append(sizes, 0)
		}
		sizes[len(sizes)-1]++
	}
	slices.SortFunc(sizes, func(a, b int) int { return b - a })
	return sizes
}

// busy runs a shell that spins on one core until the test ends: the rest
// of a loaded host (the audit's load generator took as much).
func busy(t *testing.T) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
}
