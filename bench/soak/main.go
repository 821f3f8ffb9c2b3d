// Command soak runs rls under a steady load of ever-new client addresses
// (a flood of distinct values) for about a minute and checks that neither
// its goroutines nor its memory grow: the memory store must stay within
// --memory-limit by evicting, and nothing may leak per request.
//
//	go run ./bench/soak            (make soak)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlsproject/rls/internal/proctest"
)

func main() {
	d := flag.Duration("duration", time.Minute, "how long to run")
	workers := flag.Int("workers", 16, "concurrent clients")
	flag.Parse()
	if err := run(*d, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

const config = `
domain: soak
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
      - {unit: minute, requests_per_unit: 20, algorithm: sliding_log}
      - {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
`

func run(d time.Duration, workers int) error {
	bin, err := proctest.RLS()
	if err != nil {
		return err
	}
	rls, err := proctest.Serve(proctest.Options{}, bin, config, "--memory-limit", "16MiB", "--log-level", "warn", "--watch=false")
	if err != nil {
		return err
	}
	defer rls.Stop()
	grpcAddr, httpAddr := rls.GRPCAddr, rls.HTTPAddr
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	rl := rlsv3.NewRateLimitServiceClient(cc)

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				ip := fmt.Sprintf("%d.%d.%d.%d", w, i>>16&255, i>>8&255, i&255)
				req := &rlsv3.RateLimitRequest{Domain: "soak", Descriptors: []*commonv3.RateLimitDescriptor{
					{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}},
				}}
				if _, err := rl.ShouldRateLimit(context.Background(), req); err != nil {
					failed.Add(1)
				}
				sent.Add(1)
			}
		})
	}
	type sample struct {
		at                     time.Duration
		goroutines, heap, rss  float64
		counters, counterBytes float64
	}
	var samples []sample
	var scrapeErr error
	start := time.Now()
	tick := time.NewTicker(d / 12)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			m, err := proctest.Samples("http://" + httpAddr + "/metrics")
			if err != nil {
				scrapeErr = fmt.Errorf("reading rls's metrics: %w", err)
				cancel() // the workers stop; wg.Wait below
				continue
			}
			s := sample{time.Since(start), m["go_goroutines"], m["go_memstats_heap_inuse_bytes"], m["process_resident_memory_bytes"], m["rls_memstore_counters"], m["rls_memstore_bytes"]}
			samples = append(samples, s)
			fmt.Printf("%6s  %8d requests  goroutines %4.0f  heap %6.1f MiB  rss %6.1f MiB  counters %8.0f (%5.1f MiB counted)\n",
				s.at.Round(time.Second), sent.Load(), s.goroutines, s.heap/(1<<20), s.rss/(1<<20), s.counters, s.counterBytes/(1<<20))
		}
	}
	wg.Wait()
	if scrapeErr != nil {
		return scrapeErr
	}
	if len(samples) < 6 {
		return fmt.Errorf("only %d samples", len(samples))
	}
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("%d of %d requests failed", f, sent.Load())
	}
	// Compare the second third of the run (the store is full by then) with
	// the end.
	mid, end := samples[len(samples)/3], samples[len(samples)-1]
	var problems []string
	if end.goroutines > mid.goroutines+10 {
		problems = append(problems, fmt.Sprintf("goroutines grew from %.0f to %.0f", mid.goroutines, end.goroutines))
	}
	if end.heap > 1.5*mid.heap+8<<20 {
		problems = append(problems, fmt.Sprintf("heap grew from %.1f to %.1f MiB", mid.heap/(1<<20), end.heap/(1<<20)))
	}
	if end.counterBytes > 16<<20 {
		problems = append(problems, fmt.Sprintf("the memory store holds %.1f MiB, over its 16 MiB bound", end.counterBytes/(1<<20)))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	fmt.Printf("ok: %d requests of distinct addresses in %s; goroutines %.0f → %.0f, heap %.1f → %.1f MiB, store %.1f MiB (bound 16 MiB)\n",
		sent.Load(), d, mid.goroutines, end.goroutines, mid.heap/(1<<20), end.heap/(1<<20), end.counterBytes/(1<<20))
	return nil
}
