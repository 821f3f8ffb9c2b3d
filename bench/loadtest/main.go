// Command loadtest measures rls against the ceiling of the machine it runs
// on, in one run: a bare gRPC server that answers every ShouldRateLimit with
// OK at once, rls on the memory store and rls on Redis, and optionally
// another rls binary (-compare) and another RLS server (-external), driven
// in turn with the same closed-loop load (same workers, same connections,
// same requests). It reports decisions per second, latency percentiles, the
// ratio of each to the ceiling, CPU time per request, and for Redis the
// commands per decision and decisions per round trip. Then it offers each
// target an open-loop load at half the ceiling's throughput and compares
// p99s.
//
//	go run ./bench/loadtest            (make bench)
//	go run ./bench/loadtest -keys 1    (one hot key per descriptor)
//	go run ./bench/loadtest -one-shape -redis=false -decision-log    (the decision log's cost)
//	go run ./bench/loadtest -external 127.0.0.1:8081 -request '{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}' -config d.yaml
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/rlsproject/rls/internal/grpcserver"
	"github.com/rlsproject/rls/internal/proctest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

type config struct {
	duration     time.Duration
	rounds       int
	workers      int
	conns        int
	keys         int
	redis        bool
	rlsBin       string
	serveOnly    string
	out          string
	memoryLimit  string
	onlyOneShape bool
	profileDir   string
	// another RLS server measured beside rls, and the request of the shape
	// they are all sent (a template; see expand).
	external                      string
	externalPID, externalRedisPID int
	request                       string
	rlsConfig                     string
	// another rls binary measured beside this one (memory and Redis).
	compare string
	// also measure rls with the decision log on at 100 % (memory store).
	decisionLog bool
	// top keys per limit of the rls targets (--top-keys; 0 off).
	topKeys int
}

func run() error {
	var c config
	flag.DurationVar(&c.duration, "duration", 3*time.Second, "length of one measurement")
	flag.IntVar(&c.rounds, "rounds", 3, "rounds of A B C")
	flag.IntVar(&c.workers, "workers", 32, "closed-loop workers (requests in flight)")
	flag.IntVar(&c.conns, "conns", 4, "gRPC connections the workers share")
	flag.IntVar(&c.keys, "keys", 10000, "distinct values per descriptor entry: request i has every value of its template suffixed -(i mod keys)")
	flag.BoolVar(&c.redis, "redis", true, "also measure rls on Redis (needs redis-server in PATH)")
	flag.StringVar(&c.rlsBin, "rls", "", "rls binary (default: a build of ./cmd/rls, shared with the tests)")
	flag.StringVar(&c.serveOnly, "serve-ceiling", "", "internal: serve the bare gRPC ceiling on this address")
	flag.StringVar(&c.out, "out", "", "also write the result table (markdown) to this file")
	flag.StringVar(&c.memoryLimit, "memory-limit", "1GiB", "rls --memory-limit for the memory store")
	flag.BoolVar(&c.onlyOneShape, "one-shape", false, "only the first shape (1 descriptor × 3 windows)")
	flag.StringVar(&c.profileDir, "profile-dir", "", "write a CPU profile of each rls target, taken during its first closed-loop round of each shape, into this directory")
	flag.StringVar(&c.external, "external", "", "also measure another RateLimitService server at this `address` (host:port, plaintext gRPC), e.g. one you built yourself: it gets the same requests")
	flag.IntVar(&c.externalPID, "external-pid", 0, "`pid` of the -external server, for its CPU time per request")
	flag.IntVar(&c.externalRedisPID, "external-redis-pid", 0, "`pid` of the Redis the -external server uses, for its CPU time per request")
	flag.StringVar(&c.request, "request", "", "a RateLimitRequest in proto3 `JSON`: the one shape measured instead of the built-in two; each entry's value gets the suffix -(i mod -keys)")
	flag.StringVar(&c.rlsConfig, "config", "", "rls's config `file` for the targets it serves (default: the built-in one, whose domain bench has remote_address, api_key, path and tenant); give one with -request's domain and keys")
	flag.StringVar(&c.compare, "compare", "", "another rls `binary` (an older build, say) measured beside this one, on the memory store and on a Redis of its own")
	flag.BoolVar(&c.decisionLog, "decision-log", false, "also measure rls on the memory store with the decision log on at 100 % (--decision-log to a file of a temporary directory, started over at 256MiB)")
	flag.IntVar(&c.topKeys, "top-keys", -1, "rls --top-keys for the rls targets (0 turns top keys off; default: rls's)")
	pprofAddr := flag.String("ceiling-pprof", "", "internal: with -serve-ceiling, serve /debug/pprof on this address")
	flag.Parse()
	// The generator allocates little per request; collect it rarely, as the
	// servers do.
	debug.SetGCPercent(400)
	if c.serveOnly != "" {
		// The same collector settings as rls: the comparison is about the
		// work of deciding, not about GC tuning.
		_, gogc := os.LookupEnv("GOGC")
		_, memLimit := os.LookupEnv("GOMEMLIMIT")
		grpcserver.TuneGC(0, grpcserver.EnvGC{GOGC: gogc, GOMEMLIMIT: memLimit})
		if *pprofAddr != "" {
			go http.ListenAndServe(*pprofAddr, nil) // net/http/pprof registers on the default mux
		}
		return serveCeiling(c.serveOnly)
	}

	dir, err := os.MkdirTemp("", "rls-loadtest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if c.rlsBin == "" {
		if c.rlsBin, err = proctest.RLS(); err != nil {
			return err
		}
	}
	var running []interface{ Stop() error }
	defer func() {
		// Last started, first stopped: rls before the Redis it uses.
		for i := len(running) - 1; i >= 0; i-- {
			running[i].Stop()
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ceilingAddr, err := proctest.FreeAddr()
	if err != nil {
		return err
	}
	p, err := proctest.Launch(proctest.Options{Name: "ceiling"}, self, "-serve-ceiling", ceilingAddr)
	if err != nil {
		return err
	}
	running = append(running, p)
	if err := p.WaitFor(proctest.Listening(ceilingAddr)); err != nil {
		return err
	}
	targets := []*target{{name: "ceiling (bare gRPC, always OK)", addr: ceilingAddr, serverPid: p.Pid()}}

	cfgText := benchConfig
	if c.rlsConfig != "" {
		b, err := os.ReadFile(c.rlsConfig)
		if err != nil {
			return err
		}
		cfgText = string(b)
	}
	bins := []struct{ label, path string }{{"rls", c.rlsBin}}
	if c.compare != "" {
		bins = append(bins, struct{ label, path string }{"rls " + filepath.Base(c.compare), c.compare})
	}
	var top []string
	if c.topKeys >= 0 {
		top = []string{"--top-keys", strconv.Itoa(c.topKeys)}
	}
	for bi, bin := range bins {
		mem, err := proctest.Serve(proctest.Options{Name: bin.label + "-memory"}, bin.path, cfgText, append([]string{"--log-level", "warn", "--watch=false", "--memory-limit", c.memoryLimit}, top...)...)
		if err != nil {
			return err
		}
		running = append(running, mem)
		targets = append(targets, &target{name: bin.label + ", memory store", addr: mem.GRPCAddr, http: mem.HTTPAddr, serverPid: mem.Pid()})
		if c.decisionLog && bi == 0 {
			logged, err := proctest.Serve(proctest.Options{Name: bin.label + "-memory-logged"}, bin.path, cfgText, append([]string{"--log-level", "warn", "--watch=false", "--memory-limit", c.memoryLimit,
				"--decision-log", filepath.Join(dir, "decisions.log"), "--decision-log-max-size", "256MiB", "--decision-log-backups", "0"}, top...)...)
			if err != nil {
				return err
			}
			running = append(running, logged)
			targets = append(targets, &target{name: bin.label + ", memory, decision log", addr: logged.GRPCAddr, http: logged.HTTPAddr, serverPid: logged.Pid()})
		}
		if !c.redis {
			continue
		}
		port, err := proctest.FreePort()
		if err != nil {
			return err
		}
		redis, err := proctest.LaunchRedis(proctest.Options{Name: bin.label + "-redis"}, port, dir)
		if err != nil {
			return fmt.Errorf("%w (or pass -redis=false)", err)
		}
		running = append(running, redis)
		redisAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		red, err := proctest.Serve(proctest.Options{Name: bin.label + "-on-redis"}, bin.path, cfgText,
			append([]string{"--store", "redis", "--redis-url", "redis://" + redisAddr + "/0", "--log-level", "warn", "--watch=false", "--store-timeout", "100ms"}, top...)...)
		if err != nil {
			return err
		}
		running = append(running, red)
		targets = append(targets, &target{name: bin.label + ", Redis store", addr: red.GRPCAddr, http: red.HTTPAddr, redis: redisAddr, serverPid: red.Pid(), redisPid: redis.Pid()})
	}
	if c.external != "" {
		targets = append(targets, &target{name: "external " + c.external, addr: c.external, serverPid: c.externalPID, redisPid: c.externalRedisPID})
	}
	for _, t := range targets {
		if err := t.dial(c.conns); err != nil {
			return err
		}
	}
	shapes := []shape{
		{"1 descriptor × 3 windows", expand(oneByThree, c.keys)},
		{"3 descriptors × 2 windows", expand(threeByTwo, c.keys)},
		{"1 leased descriptor × 2 windows, one key", expand(leasedHot, 1)},
	}
	if c.onlyOneShape {
		shapes = shapes[:1]
	}
	if c.request != "" {
		var tmpl rlsv3.RateLimitRequest
		if err := protojson.Unmarshal([]byte(c.request), &tmpl); err != nil {
			return fmt.Errorf("-request: %w", err)
		}
		shapes = []shape{{"-request", expand(&tmpl, c.keys)}}
	}
	fmt.Fprintf(os.Stderr, "machine: %d CPUs; %d workers over %d connections; %s per measurement, %d rounds\n",
		numCPU(), c.workers, c.conns, c.duration, c.rounds)

	var table, calls strings.Builder
	fmt.Fprintf(&table, "| shape | target | decisions/s | × ceiling | p50 | p99 | p99.9 | p99 at ½ ceiling load | × ceiling p99 | FCALL/decision | Redis commands/decision (in scripts too) | decisions/round trip | CPU µs/request: generator, server, Redis |\n")
	fmt.Fprintf(&table, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, sh := range shapes {
		// Warm up every target (connections, caches, JIT-free but GC sizing).
		for _, t := range targets {
			closedLoop(t, sh.reqs, c.workers, time.Second/2)
		}
		results := make([][]result, len(targets))
		var before, after []redisCounters
		for _, t := range targets {
			before = append(before, t.redisCounters())
		}
		for r := range c.rounds {
			for i, t := range targets {
				var profiled chan error
				if c.profileDir != "" && r == 0 && t.http != "" {
					profiled = make(chan error, 1)
					name := filepath.Join(c.profileDir, fmt.Sprintf("%s-%s.pprof", shapeSlug(sh.name), shapeSlug(t.name)))
					go func() { profiled <- t.cpuProfile(name, c.duration-c.duration/4) }()
				}
				g0, s0, r0 := sampleUse(os.Getpid()), sampleUse(t.serverPid), sampleUse(t.redisPid)
				res := closedLoop(t, sh.reqs, c.workers, c.duration)
				if profiled != nil {
					if err := <-profiled; err != nil {
						return err
					}
				}
				t.use.generator.add(sampleUse(os.Getpid()), g0)
				t.use.server.add(sampleUse(t.serverPid), s0)
				t.use.redis.add(sampleUse(t.redisPid), r0)
				t.use.requests += res.requestsAnswered
				results[i] = append(results[i], res)
				fmt.Fprintf(os.Stderr, "%-28s round %d %-26s %9.0f/s p99 %v errors %d\n", sh.name, r+1, t.name, res.rate, res.p99.Round(time.Microsecond), res.errors)
			}
		}
		for _, t := range targets {
			after = append(after, t.redisCounters())
		}
		uses := make([]targetUse, len(targets))
		for i, t := range targets {
			uses[i], t.use = t.use, targetUse{}
		}
		merged := make([]result, len(targets))
		for i := range targets {
			merged[i] = merge(results[i])
		}
		// Open loop at half the ceiling's throughput, interleaved like the
		// closed loop; the p99 is over all rounds' requests.
		half := merged[0].rate / 2
		halfLat := make([][]time.Duration, len(targets))
		for r := range c.rounds {
			for i, t := range targets {
				if merged[i].rate < half {
					continue // it cannot take that load: its queue would only grow
				}
				lat := openLoop(t, sh.reqs, half, c.duration)
				halfLat[i] = append(halfLat[i], lat...)
				fmt.Fprintf(os.Stderr, "%-28s open loop %.0f/s round %d %-26s p50 %v p90 %v p99 %v\n", sh.name, half, r+1, t.name, percentile(lat, .5).Round(time.Microsecond), percentile(lat, .9).Round(time.Microsecond), percentile(lat, .99).Round(time.Microsecond))
			}
		}
		halfP99 := make([]time.Duration, len(targets))
		for i := range targets {
			slices.Sort(halfLat[i])
			halfP99[i] = percentile(halfLat[i], .99)
		}
		for i, t := range targets {
			m := merged[i]
			halfCol, halfRatio := us(halfP99[i]), fmt.Sprintf("%.2f", float64(halfP99[i])/float64(halfP99[0]))
			if len(halfLat[i]) == 0 {
				halfCol, halfRatio = "overloaded", "—"
			}
			scripts, cmds, perTrip := "", "", ""
			if t.redis != "" {
				// Per request answered: with leases, most never reach Redis.
				d, answered := after[i].decisions-before[i].decisions, float64(uses[i].requests)
				if d > 0 && answered > 0 {
					scripts = fmt.Sprintf("%.3f", (after[i].scripts-before[i].scripts)/answered)
					cmds = fmt.Sprintf("%.1f", float64(after[i].commands-before[i].commands)/answered)
					if trips := after[i].roundTrips - before[i].roundTrips; trips > 0 {
						perTrip = fmt.Sprintf("%.1f", d/trips)
					}
				}
			}
			use := uses[i]
			cpuCol := use.per(use.generator.cpu) + ", " + use.per(use.server.cpu)
			callsCol := use.calls(use.generator) + ", " + use.calls(use.server)
			if t.redisPid != 0 {
				cpuCol += ", " + use.per(use.redis.cpu)
				callsCol += ", " + use.calls(use.redis)
			}
			fmt.Fprintf(&calls, "| %s | %s | %s |\n", sh.name, t.name, callsCol)
			fmt.Fprintf(&table, "| %s | %s | %.0f | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				sh.name, t.name, m.rate, m.rate/merged[0].rate, us(m.p50), us(m.p99), us(m.p999),
				halfCol, halfRatio, scripts, cmds, perTrip, cpuCol)
		}
	}
	table.WriteString("\n" + callsHead + calls.String())
	fmt.Println()
	fmt.Print(table.String())
	if c.out != "" {
		return os.WriteFile(c.out, []byte(table.String()), 0o644)
	}
	return nil
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) }

// benchConfig has limits high enough that every request is admitted: the
// work of counting is done in full, nothing short-circuits on a denial.
const benchConfig = `
domain: bench
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 1000000, algorithm: token_bucket, burst: 1000000}
      - {unit: day, requests_per_unit: 1000000000}
  - key: path
    rate_limits:
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000}
  - key: tenant
    rate_limits:
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
  - key: global
    lease: true
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
`

type shape struct {
	name string
	reqs []wireRequest
}

// wireRequest is a RateLimitRequest marshaled once, up front: the load
// generator shares the machine with the servers and must spend as little as
// it can per request, the same for every target.
type wireRequest []byte

// reply keeps only the overall code of a response: decoding whole responses
// would charge the richer answers of rls (statuses with limits and
// durations) to the generator's CPU, which the servers share.
type reply struct{ code uint64 }

// lightCodec sends wireRequests as they are and reads only field 1
// (overall_code) of responses.
type lightCodec struct{}

func (lightCodec) Name() string { return "proto" }

func (lightCodec) Marshal(v any) (mem.BufferSlice, error) {
	w, ok := v.(*wireRequest)
	if !ok {
		return nil, fmt.Errorf("lightCodec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*w)}, nil
}

func (lightCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*reply)
	if !ok {
		return fmt.Errorf("lightCodec: cannot unmarshal into %T", v)
	}
	b := data.Materialize()
	r.code = 0
	if len(b) >= 2 && b[0] == 0x08 { // field 1, varint
		r.code = uint64(b[1])
	}
	return nil
}

const method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// call sends one request on connection cc.
func call(cc *grpc.ClientConn, req *wireRequest) error {
	var r reply
	return cc.Invoke(context.Background(), method, req, &r, grpc.ForceCodecV2(lightCodec{}))
}

// The built-in shapes' templates, on benchConfig: one descriptor of three
// windows, and three descriptors of two windows each.
var (
	oneByThree = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{
		descriptor("remote_address", "10.0.0.1")}}
	threeByTwo = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{
		descriptor("api_key", "key"), descriptor("path", "/api/v1/items"), descriptor("tenant", "tenant")}}
	// A hot global limit of two windows, leased (lease: true): always one
	// key, whatever -keys says.
	leasedHot = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{
		descriptor("global", "all")}}
)

func descriptor(k, v string) *commonv3.RateLimitDescriptor {
	return &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
}

// expand returns keys requests made of tmpl: in request i every entry's
// value has the suffix -(i mod keys), so that each descriptor counts keys
// distinct counters (1: one hot key each).
func expand(tmpl *rlsv3.RateLimitRequest, keys int) []wireRequest {
	out := make([]wireRequest, max(keys, 1))
	for i := range out {
		r := proto.Clone(tmpl).(*rlsv3.RateLimitRequest)
		for _, d := range r.Descriptors {
			for _, e := range d.Entries {
				e.Value += "-" + strconv.Itoa(i)
			}
		}
		b, err := proto.Marshal(r)
		if err != nil {
			panic(err)
		}
		out[i] = b
	}
	return out
}

// target is one server under load.
type target struct {
	name  string
	addr  string
	http  string
	redis string
	conns []*grpc.ClientConn
	// pids of the server and (Redis target) redis-server, for what they use
	serverPid, redisPid int
	use                 targetUse
}

// callsHead heads the second table: each process's system calls per
// request answered, over the closed-loop rounds.
const callsHead = "| shape | target | read/write system calls per request: generator, server, Redis |\n|---|---|---|\n"

// targetUse sums what the closed-loop measurements of a target used in each
// process (procUse), and the requests they answered.
type targetUse struct {
	generator, server, redis procUse
	requests                 int64
}

func (c targetUse) per(d time.Duration) string {
	if c.requests == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", float64(d.Microseconds())/float64(c.requests))
}

// calls returns p's read and write system calls per request answered.
func (c targetUse) calls(p procUse) string {
	if c.requests == 0 {
		return "—"
	}
	n := float64(c.requests)
	return fmt.Sprintf("%.2f/%.2f", float64(p.reads)/n, float64(p.writes)/n)
}

// procUse is what a process used: CPU time, and read and write system
// calls (the sockets' among them: each write on loopback also runs the
// receiver's side of TCP, so a server that answers in fewer writes costs
// its client less too).
type procUse struct {
	cpu           time.Duration
	reads, writes int64
}

// sampleUse reads what process pid has used so far (nothing for pid 0).
func sampleUse(pid int) procUse {
	if pid == 0 {
		return procUse{}
	}
	r, w := proctest.IOCalls(pid)
	return procUse{cpu: proctest.CPUTime(pid), reads: r, writes: w}
}

// add adds to u what was used between the samples from and to.
func (u *procUse) add(to, from procUse) {
	u.cpu += to.cpu - from.cpu
	u.reads += to.reads - from.reads
	u.writes += to.writes - from.writes
}

// cpuProfile saves a CPU profile of the target (its /debug/pprof) taken
// over d into file.
func (t *target) cpuProfile(file string, d time.Duration) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", t.http, max(1, int(d.Seconds()))))
	if err != nil {
		return fmt.Errorf("profiling %s: %w", t.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profiling %s: %s %v", t.name, resp.Status, err)
	}
	return os.WriteFile(file, b, 0o644)
}

// shapeSlug turns a name into a file name part.
func shapeSlug(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
}

func (t *target) dial(n int) error {
	for range n {
		cc, err := grpc.NewClient(t.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		t.conns = append(t.conns, cc)
	}
	return nil
}

type result struct {
	rate             float64
	p50, p99, p999   time.Duration
	errors           int64
	latencies        []time.Duration
	elapsed          time.Duration
	requestsAnswered int64
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

func merge(rs []result) result {
	var all []time.Duration
	var n int64
	var el time.Duration
	var errs int64
	for _, r := range rs {
		all = append(all, r.latencies...)
		n += r.requestsAnswered
		el += r.elapsed
		errs += r.errors
	}
	slices.Sort(all)
	return result{rate: float64(n) / el.Seconds(), p50: percentile(all, .5), p99: percentile(all, .99), p999: percentile(all, .999), errors: errs}
}

// closedLoop runs workers that each send the next request as soon as the
// previous one is answered, for d.
func closedLoop(t *target, reqs []wireRequest, workers int, d time.Duration) result {
	var next atomic.Int64
	var errs atomic.Int64
	lat := make([][]time.Duration, workers)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		cc := t.conns[w%len(t.conns)]
		wg.Go(func() {
			mine := make([]time.Duration, 0, 1<<16)
			for ctx.Err() == nil {
				req := &reqs[int(next.Add(1))%len(reqs)]
				t0 := time.Now()
				err := call(cc, req)
				if err != nil {
					errs.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			lat[w] = mine
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	return result{
		rate: float64(len(all)) / elapsed.Seconds(), p50: percentile(all, .5), p99: percentile(all, .99), p999: percentile(all, .999),
		errors: errs.Load(), latencies: all, elapsed: elapsed, requestsAnswered: int64(len(all)),
	}
}

// openLoop offers rate requests per second for d, whatever the answers
// take, and returns the sorted latencies measured from each request's
// scheduled start (so that a stall counts for every request it delays).
// Senders each own an evenly spaced share of the schedule.
func openLoop(t *target, reqs []wireRequest, rate float64, d time.Duration) []time.Duration {
	const senders = 64
	interval := time.Duration(float64(time.Second) / rate)
	n := int(d / interval)
	lat := make([]time.Duration, n)
	start := time.Now().Add(10 * time.Millisecond)
	var wg sync.WaitGroup
	for k := range senders {
		cc := t.conns[k%len(t.conns)]
		wg.Go(func() {
			for i := k; i < n; i += senders {
				due := start.Add(time.Duration(i) * interval)
				if w := time.Until(due); w > 0 {
					time.Sleep(w)
				}
				if err := call(cc, &reqs[i%len(reqs)]); err != nil {
					lat[i] = time.Hour
					continue
				}
				lat[i] = time.Since(due)
			}
		})
	}
	wg.Wait()
	slices.Sort(lat)
	return lat
}

// redisCounters are the counts that turn into commands per decision and
// decisions per round trip.
type redisCounters struct {
	decisions, roundTrips, scripts, commands float64
}

func (t *target) redisCounters() redisCounters {
	if t.redis == "" {
		return redisCounters{}
	}
	var c redisCounters
	m, _ := proctest.Samples("http://" + t.http + "/metrics") // none: the table shows 0
	c.decisions = m["rls_redis_decisions_total"]
	c.roundTrips = m["rls_redis_round_trips_total"]
	c.scripts = m["rls_redis_scripts_total"]
	c.commands = redisCommands(t.redis)
	return c
}

// redisCommands returns the number of commands Redis has processed, from
// INFO stats, spoken in RESP by hand to need no client.
func redisCommands(addr string) float64 {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	io.WriteString(conn, "*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f - 1 // this INFO
		}
	}
}

// ceiling answers every ShouldRateLimit with OK at once.
type ceiling struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

var okResponse = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

func (ceiling) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return okResponse, nil
}

// serveCeiling serves the bare gRPC server until SIGTERM. It uses the same
// grpc-go server settings as rls, so the difference is rls's own work.
func serveCeiling(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	gs := grpc.NewServer(grpcserver.Options(grpcserver.Limits{})...)
	rlsv3.RegisterRateLimitServiceServer(gs, ceiling{})
	sig := make(chan os.Signal, 1)
	signalNotify(sig)
	go func() { <-sig; gs.Stop() }()
	return gs.Serve(l)
}

func signalNotify(c chan os.Signal) { signal.Notify(c, syscall.SIGTERM, os.Interrupt) }

func numCPU() int { return runtime.GOMAXPROCS(0) }
