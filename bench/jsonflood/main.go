// Command jsonflood measures what a flood of hostile POST /json bodies
// costs the other clients of rls: it starts rls on the memory store, runs
// a normal gRPC client (one ShouldRateLimit at a time, as one Envoy worker
// would) alone, then beside senders that each post, over and over, a body
// of 349,509 empty descriptors ({}), 1 MB, which rls refuses (400). It
// reports the gRPC client's latency percentiles in both phases, and the
// flood's refusals: how many, how long each took to be answered, and rls's
// CPU time per refusal.
//
//	go run ./bench/jsonflood                     (a build of ./cmd/rls)
//	go run ./bench/jsonflood -rls /tmp/old/rls   (another build, to compare)
//	go run ./bench/jsonflood -chunked            (bodies without Content-Length)
//	go run ./bench/jsonflood -grpc-flood         (the same flood over gRPC, for comparison)
//	go run ./bench/jsonflood -worst 556000       (the costliest body within the cap)
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/proctest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "jsonflood:", err)
		os.Exit(1)
	}
}

const limitsYAML = `domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

func run() error {
	rlsBin := flag.String("rls", "", "rls binary (default: a build of ./cmd/rls, shared with the tests)")
	senders := flag.Int("senders", 8, "flood senders, each one request at a time on its own connection")
	descs := flag.Int("descriptors", 349509, "empty descriptors ({}) in each flood body (349,509: 1 MB)")
	duration := flag.Duration("duration", 5*time.Second, "length of each phase")
	chunked := flag.Bool("chunked", false, "send the flood bodies without Content-Length (chunked)")
	worst := flag.Int("worst", 0, "instead of empty descriptors, a valid request followed by an unknown field of a string this long, which the check reads to the end (the worst body under the cap: 556000)")
	grpcFlood := flag.Bool("grpc-flood", false, "flood over gRPC instead: RateLimitRequests of empty descriptors, 1 MB (InvalidArgument)")
	flag.Parse()

	if *rlsBin == "" {
		var err error
		if *rlsBin, err = proctest.RLS(); err != nil {
			return err
		}
	}
	p, err := proctest.Serve(proctest.Options{}, *rlsBin, limitsYAML, "--log-level", "warn", "--watch=false")
	if err != nil {
		return err
	}
	defer p.Stop()
	grpcAddr, httpAddr := p.GRPCAddr, p.HTTPAddr

	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)

	body := floodBody(*descs)
	if *worst > 0 {
		body = []byte(`{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"203.0.113.9"}]}],"x":"` + strings.Repeat("a", *worst) + `"}`)
	}
	how := map[bool]string{true: "chunked", false: "with Content-Length"}[*chunked]
	if *grpcFlood {
		body, how = grpcFloodRequest(1_048_000), "over gRPC"
	}
	fmt.Printf("rls %s; flood: %d senders, bodies of %d bytes, %s; %s per phase\n", *rlsBin, *senders, len(body), how, *duration)

	alone := grpcLatencies(client, *duration)
	fmt.Printf("gRPC alone:       %s\n", alone)

	ctx, stop := context.WithCancel(context.Background())
	f := &flood{url: "http://" + httpAddr + "/json", grpcAddr: grpcAddr, body: body, chunked: *chunked}
	var wg sync.WaitGroup
	for range *senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if *grpcFlood {
				f.sendGRPC(ctx)
			} else {
				f.send(ctx)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the flood under way
	cpu0, n0 := proctest.CPUTime(p.Pid()), f.done.Load()
	during := grpcLatencies(client, *duration)
	cpu1, n1 := proctest.CPUTime(p.Pid()), f.done.Load()
	stop()
	wg.Wait()
	fmt.Printf("gRPC beside flood: %s\n", during)
	refusals := n1 - n0
	f.mu.Lock()
	slices.Sort(f.took)
	took := f.took
	f.mu.Unlock()
	perRefusal := time.Duration(0)
	if refusals > 0 {
		perRefusal = (cpu1 - cpu0) / time.Duration(refusals)
	}
	fmt.Printf("flood: %d answers in the measured phase (%.0f/s), rls CPU %s per answer; answer time p50 %s p99 %s; statuses %v; client errors %d\n",
		refusals, float64(refusals)/duration.Seconds(), perRefusal.Round(10*time.Microsecond),
		pct(took, 0.50), pct(took, 0.99), f.statuses(), f.errs.Load())
	return nil
}

// floodBody is a RateLimitRequest of n empty descriptors.
func floodBody(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"domain":"api","descriptors":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("{}")
	}
	b.WriteString("]}")
	return b.Bytes()
}

// grpcFloodRequest is the wire form of a RateLimitRequest of domain api
// and empty descriptors, size bytes long.
func grpcFloodRequest(size int) []byte {
	b := []byte{0x0a, 3, 'a', 'p', 'i'} // domain
	for len(b)+2 <= size {
		b = append(b, 0x12, 0) // descriptors: an empty one
	}
	return b
}

// flood posts its body over and over. Safe for concurrent use.
type flood struct {
	url      string
	grpcAddr string
	body     []byte
	chunked  bool
	done     atomic.Int64
	errs     atomic.Int64
	mu       sync.Mutex
	took     []time.Duration
	codes    map[int]int
}

// hideLen hides a reader's length, so that the request goes chunked.
type hideLen struct{ io.Reader }

func (f *flood) send(ctx context.Context) {
	// One connection per sender, as separate clients would have.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}
	defer client.CloseIdleConnections()
	for ctx.Err() == nil {
		var r io.Reader = bytes.NewReader(f.body)
		if f.chunked {
			r = hideLen{r}
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", f.url, r)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				f.errs.Add(1)
			}
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		f.done.Add(1)
		f.mu.Lock()
		f.took = append(f.took, took)
		if f.codes == nil {
			f.codes = map[int]int{}
		}
		f.codes[resp.StatusCode]++
		f.mu.Unlock()
	}
}

// sendGRPC sends the body as a ShouldRateLimit request over and over, on a
// connection of its own.
func (f *flood) sendGRPC(ctx context.Context) {
	cc, err := grpc.NewClient(f.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.errs.Add(1)
		return
	}
	defer cc.Close()
	for ctx.Err() == nil {
		start := time.Now()
		err := cc.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", rawMessage(f.body), new(rawMessage), grpc.ForceCodecV2(rawCodec{}))
		if ctx.Err() != nil {
			return
		}
		code := status.Code(err)
		took := time.Since(start)
		f.done.Add(1)
		f.mu.Lock()
		f.took = append(f.took, took)
		if f.codes == nil {
			f.codes = map[int]int{}
		}
		f.codes[int(code)]++
		f.mu.Unlock()
	}
}

// rawMessage is a message as its wire bytes.
type rawMessage []byte

// rawCodec sends rawMessages as they are and ignores what comes back.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawMessage))}, nil
}

func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }

func (f *flood) statuses() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for c, n := range f.codes {
		parts = append(parts, fmt.Sprintf("%d×%d", c, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// latencies are the sorted latencies of a phase.
type latencies []time.Duration

func (l latencies) String() string {
	return fmt.Sprintf("%d requests, p50 %s p90 %s p99 %s max %s", len(l), pct(l, 0.5), pct(l, 0.9), pct(l, 0.99), pct(l, 1))
}

func pct(l []time.Duration, q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	i := min(int(q*float64(len(l))), len(l)-1)
	return l[i].Round(10 * time.Microsecond)
}

// grpcLatencies sends ShouldRateLimit one at a time for d and returns the
// latencies, sorted.
func grpcLatencies(client rlsv3.RateLimitServiceClient, d time.Duration) latencies {
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}},
	}}}
	var out latencies
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "gRPC:", err)
			continue
		}
		out = append(out, time.Since(start))
	}
	slices.Sort(out)
	return out
}
