package redisstore

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

// BenchmarkScript measures what Redis spends deciding, alone: the decide
// function over pipelined FCALLs of 4 requests each (the batching the store
// reaches under load), for the many-keys workload: every request on a
// descriptor of its own among RLS_BENCH_KEYS (default 50,000: at the rate
// the benchmark reaches, a 1-second window is a new one at most visits, as
// for 10,000 client addresses at the load harness's rate). It reports
// Redis's CPU (INFO cpu: user + system) and the commands it ran (INFO
// commandstats, the scripts' own included) per decision; ns/op is the
// client's and means little. RLS_BENCH_REDIS=host:port runs it against a
// Redis of the caller's (run under valgrind --tool=callgrind, the Lua's
// instructions per decision, repeatable whatever the machine does).
//
//	go test -run '^$' -bench BenchmarkScript -benchtime 200000x ./internal/redisstore/
func BenchmarkScript(b *testing.B) {
	addr := os.Getenv("RLS_BENCH_REDIS") // a Redis of the caller's (under a profiler, say)
	if addr == "" {
		addr = redistest.Start(b).Addr()
	}
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4})
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	if err := client.FunctionLoadReplace(ctx, lib.source).Err(); err != nil {
		b.Fatal(err)
	}
	keys := 50000
	if v, err := strconv.Atoi(os.Getenv("RLS_BENCH_KEYS")); err == nil && v > 0 {
		keys = v
	}
	fw := func(w time.Duration) *engine.Rule { return storetest.Rule(engine.FixedWindow, 1<<30, w, 0) }
	sw := func(w time.Duration) *engine.Rule { return storetest.Rule(engine.SlidingWindow, 1<<30, w, 0) }
	for _, shape := range []struct {
		name  string
		descs [][]*engine.Rule // per descriptor, its rules
	}{
		{"1x3", [][]*engine.Rule{{fw(time.Second), fw(time.Minute), sw(time.Hour)}}},
		{"3x2", [][]*engine.Rule{
			{storetest.Rule(engine.TokenBucket, 1000000, time.Second, 1000000), fw(24 * time.Hour)},
			{fw(time.Minute), fw(time.Hour)},
			{fw(time.Minute), sw(time.Hour)},
		}},
	} {
		b.Run(shape.name, func(b *testing.B) {
			// The requests, encoded once: request i is on descriptors of
			// key i mod keys.
			reqs := make([][]any, keys)
			for k := range reqs {
				var items []engine.Item
				var bases []string
				for d, rules := range shape.descs {
					desc := fmt.Sprintf("bench/k%d=%d", d, k)
					for _, r := range rules {
						items = append(items, engine.Item{Desc: desc, Rule: r, Hits: 1})
						bases = append(bases, engine.CounterKey("rls:", desc, r))
					}
				}
				reqs[k] = newRequest(modeFinal, "", time.Now(), items, bases).appendArgs(nil)
			}
			const perScript, scriptsPerTrip = 4, 8
			cpu0, stats0 := redisCPU(b, addr), commandStats(b, client)
			b.ResetTimer()
			next := 0
			for done := 0; done < b.N; {
				pipe := client.Pipeline()
				for range scriptsPerTrip {
					n := min(perScript, b.N-done)
					if n == 0 {
						break
					}
					args := []any{n}
					for range n {
						args = append(args, reqs[next%keys]...)
						next++
					}
					pipe.FCall(ctx, lib.decide, []string{"rls:{bench}"}, args...)
					done += n
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cpu := redisCPU(b, addr) - cpu0
			b.ReportMetric(cpu*1e6/float64(b.N), "redis-cpu-µs/decision")
			stats := commandStats(b, client)
			for name, st := range stats {
				if d := st.calls - stats0[name].calls; d > 0 && name != "info" {
					b.ReportMetric(float64(d)/float64(b.N), name+"/decision")
					b.ReportMetric((st.usec-stats0[name].usec)/float64(b.N), name+"-µs/decision")
				}
			}
		})
	}
}

// cmdStat is one command's line of INFO commandstats: its calls and the µs
// they took (a script's include the commands it ran).
type cmdStat struct{ calls, usec float64 }

// commandStats returns the calls of each command Redis has run (INFO
// commandstats), by lower-case name.
func commandStats(tb testing.TB, client redis.UniversalClient) map[string]cmdStat {
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				st.calls = n
			case "usec":
				st.usec = n
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}
