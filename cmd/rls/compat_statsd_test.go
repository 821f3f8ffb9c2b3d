package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
)

// collector is a StatsD collector on 127.0.0.1 (TCP or UDP) that adds up
// what it receives by stat: a line `name:v|type[|#tags]` counts v under
// `name|type[|#tags]`. Its goroutines end with the test.
type collector struct {
	addr string
	mu   sync.Mutex
	sums map[string]uint64
	seen []string // every line, in order
}

func newCollector(t *testing.T, network string) *collector {
	t.Helper()
	c := &collector{sums: map[string]uint64{}}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	switch network {
	case "udp":
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		c.addr = pc.LocalAddr().String()
		wg.Go(func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				for _, l := range strings.Split(strings.TrimSuffix(string(buf[:n]), "\n"), "\n") {
					c.add(l)
				}
			}
		})
	case "tcp":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var conns sync.Map
		t.Cleanup(func() {
			ln.Close()
			conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		})
		c.addr = ln.Addr().String()
		wg.Go(func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				conns.Store(conn, nil)
				wg.Go(func() {
					sc := bufio.NewScanner(conn)
					for sc.Scan() {
						c.add(sc.Text())
					}
				})
			}
		})
	}
	return c
}

func (c *collector) add(line string) {
	name, rest, ok := strings.Cut(line, ":")
	if !ok {
		return
	}
	v, rest, _ := strings.Cut(rest, "|")
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sums[name+"|"+rest] += n
	c.seen = append(c.seen, line)
}

// has reports whether the sums of want (stat → sum) are all reached.
func (c *collector) has(want map[string]uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range want {
		if c.sums[k] != v {
			return false
		}
	}
	return true
}

func (c *collector) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.seen, "\n")
}

// waitFor waits until the collector has received want, failing with what
// it received instead.
func (c *collector) waitFor(t *testing.T, s *server, what string, want map[string]uint64) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the collector received:\n%s", c)
		}
	})
	s.waitUntil(t, what, func() bool { return c.has(want) })
}

// statsdServe starts rls as /bin/ratelimit on a Redis of its own with env
// and config, its stats sent to a collector on network (STATSD_HOST,
// STATSD_PORT) every 20 ms (STATS_FLUSH_INTERVAL).
func statsdServe(t *testing.T, network string, env []string, config string) (*server, *collector) {
	t.Helper()
	rds := redistest.Start(t)
	col := newCollector(t, network)
	host, port := hostPort(t, col.addr)
	env = append([]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(), "STATSD_HOST=" + host, "STATSD_PORT=" + port, "STATS_FLUSH_INTERVAL=20ms"}, env...)
	return compatServeWithStats(t, env, config), col
}

// referenceFile is one of the reference's integration test configs.
func referenceFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "internal", "compat", "testdata", "envoy-ratelimit", "integration", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// unspecConfig is the reference's integration example of detailed_metric
// (examples/ratelimit/config/example.yaml, domain rl), which its script
// value-included-in-stats-key-when-unspecified.sh checks through a
// statsd_exporter: after three requests on a limit of 2,
// ratelimit_service_rate_limit_over_limit{key1="unspec_unspecified_value"}
// is 1. That series is the exporter's mapping of the line
// ratelimit.service.rate_limit.rl.unspec_unspecified_value.over_limit.
const unspecConfig = "domain: rl\ndescriptors:\n  - key: unspec\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n"

func askUnspecThrice(t *testing.T, s *server) {
	t.Helper()
	cl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := cl.ShouldRateLimit(context.Background(), rlRequest("rl", "unspec", "unspecified_value"))
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("request %d: %v %v, want %v", i+1, resp.GetOverallCode(), err, want)
		}
	}
}

// USE_STATSD (the reference's default) sends its stats to
// STATSD_HOST:STATSD_PORT over TCP every STATS_FLUSH_INTERVAL, EXTRA_TAGS
// in the names: the reference's TestBasicConfig_ExtraTags (tags foo:bar
// and a:b, one request on basic/key1) reads
// ratelimit.service.rate_limit.basic.key1.total_hits and
// ratelimit.service.config_load_success with those tags at 1. These
// variables were ignored.
func TestCompatStatsdTCP(t *testing.T) {
	s, col := statsdServe(t, "tcp", []string{"EXTRA_TAGS=foo:bar,a:b"}, referenceFile(t, "basic.yaml"))
	cl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	if _, err := cl.ShouldRateLimit(context.Background(), rlRequest("basic", "key1", "foo")); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, s, "the stats of one request on basic/key1 over TCP", map[string]uint64{
		"ratelimit.service.rate_limit.basic.key1.total_hits.__a=b.__foo=bar|c":   1,
		"ratelimit.service.rate_limit.basic.key1.within_limit.__a=b.__foo=bar|c": 1,
		"ratelimit.service.config_load_success.__a=b.__foo=bar|c":                1,
	})
}

// STATSD_PROTOCOL=udp (read by the reference's stats library) sends the
// same lines over UDP: the reference's detailed_metric integration check.
func TestCompatStatsdUDP(t *testing.T) {
	s, col := statsdServe(t, "udp", []string{"USE_STATSD=true", "STATSD_PROTOCOL=udp"}, unspecConfig)
	askUnspecThrice(t, s)
	const p = "ratelimit.service.rate_limit.rl.unspec_unspecified_value."
	col.waitFor(t, s, "the stats of three requests on rl/unspec over UDP", map[string]uint64{
		p + "over_limit|c": 1, p + "total_hits|c": 3, p + "within_limit|c": 2, p + "near_limit|c": 1,
		"ratelimit.service.config_load_success|c": 1,
	})
}

// USE_DOG_STATSD sends DogStatsD over UDP to STATSD_HOST:STATSD_PORT: the
// tags of DD_SERVICE (read by the reference's client), EXTRA_TAGS as tags,
// and USE_DOG_STATSD_MOGRIFIERS's renaming (the reference's README example
// HITS: the stat's name without its key, the domain and the key as tags).
func TestCompatDogStatsd(t *testing.T) {
	s, col := statsdServe(t, "udp", []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "EXTRA_TAGS=env:prod", "DD_SERVICE=ratelimit",
		"USE_DOG_STATSD_MOGRIFIERS=HITS",
		`DOG_STATSD_MOGRIFIER_HITS_PATTERN=^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
		"DOG_STATSD_MOGRIFIER_HITS_NAME=ratelimit.service.rate_limit.$3",
		"DOG_STATSD_MOGRIFIER_HITS_TAGS=domain:$1,descriptor:$2",
	}, unspecConfig)
	askUnspecThrice(t, s)
	const tags = "|#service:ratelimit,env:prod,descriptor:unspec_unspecified_value,domain:rl"
	col.waitFor(t, s, "the DogStatsD stats of three requests on rl/unspec", map[string]uint64{
		"ratelimit.service.rate_limit.over_limit|c" + tags:                    1,
		"ratelimit.service.rate_limit.total_hits|c" + tags:                    3,
		"ratelimit.service.rate_limit.within_limit|c" + tags:                  2,
		"ratelimit.service.config_load_success|c|#service:ratelimit,env:prod": 1,
	})
}

// A collector that accepts and never reads costs stats, never decisions:
// rls keeps deciding while its writes wait and fail, and counts the lines
// it drops (rls_statsd_lines_dropped_total on /metrics); it stops as
// always. Each round asks once for each of 100 stats keys of 1000-byte
// values (detailed_metric): 200 KB of lines, about what the sockets hold.
func TestCompatStatsdCollectorNeverReads(t *testing.T) {
	rds := redistest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range held {
			c.Close()
		}
	})
	host, port := hostPort(t, ln.Addr().String())
	s := compatServeWithStats(t, []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(),
		"STATSD_HOST=" + host, "STATSD_PORT=" + port, "STATS_FLUSH_INTERVAL=20ms"},
		"domain: d\ndescriptors:\n  - key: k\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n")
	cl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	decided := 0
	round := func() {
		for i := range 100 {
			v := fmt.Sprintf("%03d", i) + strings.Repeat("v", 997)
			resp, err := cl.ShouldRateLimit(context.Background(), rlRequest("d", "k", v))
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("decision %d while the collector does not read: %v %v, want OK", decided, resp.GetOverallCode(), err)
			}
			decided++
		}
	}
	dropped := func() float64 {
		v, _ := strconv.ParseFloat(scrapeLines(t, "http://"+s.httpAddr+"/metrics")["rls_statsd_lines_dropped_total"], 64)
		return v
	}
	s.waitUntil(t, "lines dropped", func() bool {
		round()
		return dropped() > 0
	})
	// Still deciding, every decision counted, with the writes failing.
	round()
	total := 0.0
	for series, v := range scrapeLines(t, "http://"+s.httpAddr+"/metrics") {
		if strings.HasPrefix(series, `ratelimit_service_rate_limit_total_hits{domain="d",`) {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	if int(total) != decided {
		t.Errorf("total_hits add up to %v, want %d (every decision)", total, decided)
	}
}

// DISABLE_STATS=true turns the sinks off, as the reference's does: no
// StatsD connection (without it, the last flush at the stop dials the
// collector at the latest), no PROMETHEUS_ADDR listener, and two sinks are
// not refused. It was ignored.
func TestCompatDisableStats(t *testing.T) {
	for _, disable := range []bool{false, true} {
		rds := redistest.Start(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		host, port := hostPort(t, ln.Addr().String())
		env := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(), "STATSD_HOST=" + host, "STATSD_PORT=" + port, "STATS_FLUSH_INTERVAL=1h"}
		promAddr := servetest.Addr(t)
		if disable {
			env = append(env, "DISABLE_STATS=true", "USE_STATSD=true", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR="+promAddr)
		}
		s := compatServeWithStats(t, env, referenceFile(t, "basic.yaml"))
		cl := rlsv3.NewRateLimitServiceClient(s.dial(t))
		if _, err := cl.ShouldRateLimit(context.Background(), rlRequest("basic", "key1", "foo")); err != nil {
			t.Fatal(err)
		}
		if disable {
			if c, err := net.Dial("tcp", promAddr); err == nil {
				c.Close()
				t.Errorf("DISABLE_STATS=true USE_PROMETHEUS=true: PROMETHEUS_ADDR %s accepts connections, want no listener", promAddr)
			}
		}
		s.stop(t)
		// A connection made before the stop is queued on the listener.
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		if connected := err == nil; connected == disable {
			t.Errorf("DISABLE_STATS=%v: the StatsD collector was dialled: %v, want %v", disable, connected, !disable)
		}
	}
}
