package compat

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/service"
)

// sinks says which of the reference's stats sinks cfg (read into s) has:
// the StatsD sink's variable, network, address and interval, and the
// Prometheus listener's address; "none" for none.
func sinks(s *settings, cfg daemon.Config) string {
	var out []string
	if o := s.statsd; o != nil {
		out = append(out, fmt.Sprintf("%s %s://%s every %v", o.sinkName(), o.network, o.addr, o.interval))
	}
	if a := listenerAddr(cfg, "PROMETHEUS_ADDR"); a != "" {
		out = append(out, "prometheus "+a)
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// The reference's stats sinks are read as it reads them (settings.go,
// runner.go): USE_STATSD on by default, a TCP StatsD sink at
// STATSD_HOST:STATSD_PORT (localhost:8125), STATSD_PROTOCOL (read by its
// stats library) udp for UDP; USE_DOG_STATSD over UDP at the same
// address; STATS_FLUSH_INTERVAL (10s); one sink at most, none with
// DISABLE_STATS. They were all ignored ("rls has no statsd sink").
func TestCompatStatsSinksFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env, want, err string
	}{
		{"", "USE_STATSD tcp://localhost:8125 every 10s", ""},
		{"USE_STATSD=true", "USE_STATSD tcp://localhost:8125 every 10s", ""},
		{"USE_STATSD=false", "none", ""},
		{"STATSD_HOST=statsd STATSD_PORT=9125", "USE_STATSD tcp://statsd:9125 every 10s", ""},
		{"STATSD_HOST=::1", "USE_STATSD tcp://[::1]:8125 every 10s", ""},
		{"STATSD_PORT=0", "", `STATSD_PORT="0": not a port number`},
		{"STATSD_PORT=statsd", "", `STATSD_PORT="statsd": not a port number`},
		{"STATSD_PROTOCOL=udp", "USE_STATSD udp://localhost:8125 every 10s", ""},
		{"STATSD_PROTOCOL=sctp", "", `STATSD_PROTOCOL="sctp": not tcp or udp`},
		{"STATS_FLUSH_INTERVAL=250ms", "USE_STATSD tcp://localhost:8125 every 250ms", ""},
		{"STATS_FLUSH_INTERVAL=0s", "", `STATS_FLUSH_INTERVAL="0s": not a positive duration`},
		{"USE_DOG_STATSD=true USE_STATSD=false", "USE_DOG_STATSD udp://localhost:8125 every 10s", ""},
		{"USE_DOG_STATSD=true USE_STATSD=false STATSD_HOST=agent STATSD_PORT=8126 STATSD_PROTOCOL=tcp STATS_FLUSH_INTERVAL=1s", "USE_DOG_STATSD udp://agent:8126 every 1s", ""},
		// USE_STATSD unset (true by default) gives way to the other sink.
		{"USE_DOG_STATSD=true", "USE_DOG_STATSD udp://localhost:8125 every 10s", ""},
		{"USE_PROMETHEUS=true", "prometheus :9090", ""},
		{"USE_DOG_STATSD=true USE_STATSD=true", "", `USE_DOG_STATSD="true": only one stats sink may be on, and USE_STATSD is true too`},
		{"USE_PROMETHEUS=1 USE_STATSD=true", "", `USE_PROMETHEUS="1": only one stats sink may be on, and USE_STATSD is true too`},
		{"USE_DOG_STATSD=true USE_PROMETHEUS=true USE_STATSD=false", "", `USE_DOG_STATSD="true": only one stats sink may be on, and USE_PROMETHEUS is true too`},
		// DISABLE_STATS comes first, as in the reference: no sink, no
		// refusal.
		{"DISABLE_STATS=true USE_PROMETHEUS=true USE_STATSD=true", "none", ""},
		{"DISABLE_STATS=true", "none", ""},
	} {
		env := strings.Fields(tc.env)
		s, err := readEnv(env)
		if tc.err != "" {
			var e *envError
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &e) {
				t.Errorf("%s: err = %v, want an *envError saying %s", tc.env, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.env, err)
			continue
		}
		if got := sinks(s, s.config()); got != tc.want {
			t.Errorf("%s: sinks %q, want %q", tc.env, got, tc.want)
		}
	}

	// What a sink that is off does not read is logged as ignored.
	for _, tc := range []struct{ env, want string }{
		{"USE_STATSD=false STATSD_HOST=statsd STATS_FLUSH_INTERVAL=1s", "STATSD_HOST: " + ignoredWhy("STATSD_*") + "|STATS_FLUSH_INTERVAL: " + ignoredWhy("STATS_FLUSH_INTERVAL")},
		{"DISABLE_STATS=true USE_PROMETHEUS=true USE_STATSD=true", "USE_PROMETHEUS: " + ignoredWhy("USE_PROMETHEUS") + "|USE_STATSD: " + ignoredWhy("USE_STATSD")},
		{"USE_DOG_STATSD=true STATSD_PROTOCOL=tcp", "STATSD_PROTOCOL: " + ignoredWhy("STATSD_PROTOCOL")},
		{"DOG_STATSD_MOGRIFIER_A_NAME=x USE_DOG_STATSD_MOGRIFIERS=A", "DOG_STATSD_MOGRIFIER_A_NAME: " + ignoredWhy("DOG_STATSD_*") + "|USE_DOG_STATSD_MOGRIFIERS: " + ignoredWhy("USE_DOG_STATSD_MOGRIFIERS")},
		{"USE_STATSD=true STATSD_HOST=statsd", ""},
	} {
		s, err := readEnv(strings.Fields(tc.env))
		if err != nil {
			t.Fatalf("%s: %v", tc.env, err)
		}
		if got := strings.Join(s.ignored, "|"); got != tc.want {
			t.Errorf("%s: ignored %q, want %q", tc.env, got, tc.want)
		}
	}
}

// EXTRA_TAGS goes to the StatsD sinks too (into the names with USE_STATSD,
// as tags with USE_DOG_STATSD), its names free of what would break a line;
// DD_ENTITY_ID, DD_ENV, DD_SERVICE and DD_VERSION, which the reference's
// DogStatsD client reads, tag every DogStatsD line.
func TestCompatStatsdTagsFromEnv(t *testing.T) {
	s, _ := fromEnv(t, "EXTRA_TAGS=foo:bar,a:b,kube.ns:x")
	if o := s.statsd; o == nil || fmt.Sprint(o.tags) != "[{a b} {foo bar} {kube.ns x}]" {
		t.Errorf("USE_STATSD with EXTRA_TAGS: sink %+v, want tags a, foo and kube.ns", o)
	}
	for _, bad := range []string{"a|b:v", "a b:v", "a=b:v", "#a:v"} {
		if _, err := readEnv([]string{"EXTRA_TAGS=" + bad}); err == nil || !strings.Contains(err.Error(), "is not a stats tag name") {
			t.Errorf("EXTRA_TAGS=%q with USE_STATSD: err = %v, want not a stats tag name", bad, err)
		}
	}
	s, _ = fromEnv(t, "USE_DOG_STATSD=true", "DD_ENV=prod", "DD_SERVICE=ratelimit", "DD_VERSION=1.2", "DD_ENTITY_ID=pod-1")
	if o := s.statsd; o == nil || strings.Join(o.globalTags, ",") != "dd.internal.entity_id:pod-1,env:prod,service:ratelimit,version:1.2" {
		t.Errorf("USE_DOG_STATSD with DD_*: sink %+v, want their tags in the client's order", o)
	}
	if s, _ := fromEnv(t, "DD_ENV=prod"); len(s.statsd.globalTags) != 0 || len(s.ignored) != 0 {
		t.Errorf("USE_STATSD with DD_ENV: tags %q, ignored %q; want neither", s.statsd.globalTags, s.ignored)
	}
}

// USE_DOG_STATSD_MOGRIFIERS reads each mogrifier's
// DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS as the reference
// does, and the first that matches renames a stat and tags it: the
// reference's own cases (godogstats/mogrifier_map_test.go).
func TestCompatDogStatsdMogrifiersFromEnv(t *testing.T) {
	const hits = `^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`
	for _, tc := range []struct {
		what, env, input, wantName string
		wantTags                   []string
	}{
		{"simple replacement", "USE_DOG_STATSD_MOGRIFIERS=TAG DOG_STATSD_MOGRIFIER_TAG_PATTERN=" + hits + " DOG_STATSD_MOGRIFIER_TAG_NAME=ratelimit.service.rate_limit.$3 DOG_STATSD_MOGRIFIER_TAG_TAGS=domain:$1,descriptor:$2",
			"ratelimit.service.rate_limit.mongo_cps.database_users.within_limit", "ratelimit.service.rate_limit.within_limit", []string{"descriptor:database_users", "domain:mongo_cps"}},
		{"out of bounds index", "USE_DOG_STATSD_MOGRIFIERS=TAG DOG_STATSD_MOGRIFIER_TAG_PATTERN=" + hits + " DOG_STATSD_MOGRIFIER_TAG_NAME=ratelimit.service.rate_limit.$3 DOG_STATSD_MOGRIFIER_TAG_TAGS=domain:$1,descriptor:$5",
			"ratelimit.service.rate_limit.mongo_cps.database_users.within_limit", "ratelimit.service.rate_limit.within_limit", []string{"descriptor:$5", "domain:mongo_cps"}},
		{"no placeholders in tags", "USE_DOG_STATSD_MOGRIFIERS=TAG DOG_STATSD_MOGRIFIER_TAG_PATTERN=" + hits + " DOG_STATSD_MOGRIFIER_TAG_NAME=ratelimit.service.rate_limit.$3 DOG_STATSD_MOGRIFIER_TAG_TAGS=domain:mongo_cps,descriptor:database_users",
			"ratelimit.service.rate_limit.mongo_cps.database_users.within_limit", "ratelimit.service.rate_limit.within_limit", []string{"descriptor:database_users", "domain:mongo_cps"}},
		{"no match", "USE_DOG_STATSD_MOGRIFIERS=TAG DOG_STATSD_MOGRIFIER_TAG_PATTERN=" + hits + " DOG_STATSD_MOGRIFIER_TAG_NAME=ratelimit.service.rate_limit.$3 DOG_STATSD_MOGRIFIER_TAG_TAGS=domain:$1,descriptor:$4",
			"some.unmatched.metric", "some.unmatched.metric", nil},
		{"two, the first matches", "USE_DOG_STATSD_MOGRIFIERS=SPECIFIC,WILDCARD DOG_STATSD_MOGRIFIER_SPECIFIC_PATTERN=^ratelimit\\.service\\.rate_limit\\.(.*)\\.(.*)\\.foo$ DOG_STATSD_MOGRIFIER_SPECIFIC_NAME=custom.foo DOG_STATSD_MOGRIFIER_SPECIFIC_TAGS=domain:$1,descriptor:$2 DOG_STATSD_MOGRIFIER_WILDCARD_PATTERN=" + hits + " DOG_STATSD_MOGRIFIER_WILDCARD_NAME=ratelimit.service.rate_limit.$3 DOG_STATSD_MOGRIFIER_WILDCARD_TAGS=domain:$1,descriptor:$2",
			"ratelimit.service.rate_limit.mongo_cps.database_users.foo", "custom.foo", []string{"descriptor:database_users", "domain:mongo_cps"}},
		{"two, the second matches", "USE_DOG_STATSD_MOGRIFIERS=SPECIFIC,WILDCARD DOG_STATSD_MOGRIFIER_SPECIFIC_PATTERN=^ratelimit\\.service\\.rate_limit\\.(.*)\\.(.*)\\.foo$ DOG_STATSD_MOGRIFIER_SPECIFIC_NAME=custom.foo DOG_STATSD_MOGRIFIER_SPECIFIC_TAGS=domain:$1,descriptor:$2 DOG_STATSD_MOGRIFIER_WILDCARD_PATTERN=" + hits + " DOG_STATSD_MOGRIFIER_WILDCARD_NAME=ratelimit.service.rate_limit.$3 DOG_STATSD_MOGRIFIER_WILDCARD_TAGS=domain:$1,descriptor:$2",
			"ratelimit.service.rate_limit.mongo_cps.database_users.within_limit", "ratelimit.service.rate_limit.within_limit", []string{"descriptor:database_users", "domain:mongo_cps"}},
		// A name in the list is upper-cased into its variables' names, as
		// the reference's envconfig does; TAGS may be unset.
		{"lower-case name, no tags", "USE_DOG_STATSD_MOGRIFIERS=hits DOG_STATSD_MOGRIFIER_HITS_PATTERN=^ratelimit\\.(.*)$ DOG_STATSD_MOGRIFIER_HITS_NAME=custom.$1",
			"ratelimit.service.config_load_success", "custom.service.config_load_success", []string{}},
	} {
		s, err := readEnv(append(strings.Fields(tc.env), "USE_DOG_STATSD=true"))
		if err != nil {
			t.Errorf("%s: %v", tc.what, err)
			continue
		}
		name, tags := mogrify(s.mogrifiers, tc.input)
		if name != tc.wantName || !slices.Equal(tags, tc.wantTags) {
			t.Errorf("%s: mogrify(%s) = %s %q, want %s %q", tc.what, tc.input, name, tags, tc.wantName, tc.wantTags)
		}
		if len(s.ignored) != 0 {
			t.Errorf("%s: ignored %q, want none (the mogrifiers' variables are read)", tc.what, s.ignored)
		}
	}

	// The reference's TestValidation, and what it does not start with.
	const ok = "DOG_STATSD_MOGRIFIER_TAG_PATTERN=" + hits + " DOG_STATSD_MOGRIFIER_TAG_NAME=ratelimit.service.rate_limit.$3"
	for _, tc := range []struct{ env, want string }{
		{"", `DOG_STATSD_MOGRIFIER_TAG_PATTERN="": empty or unset: mogrifier "TAG" of USE_DOG_STATSD_MOGRIFIERS needs a pattern`},
		{"DOG_STATSD_MOGRIFIER_TAG_PATTERN= DOG_STATSD_MOGRIFIER_TAG_NAME=x", `DOG_STATSD_MOGRIFIER_TAG_PATTERN="": empty or unset`},
		{"DOG_STATSD_MOGRIFIER_TAG_PATTERN=" + hits + " DOG_STATSD_MOGRIFIER_TAG_NAME=", `DOG_STATSD_MOGRIFIER_TAG_NAME="": empty or unset: mogrifier "TAG" of USE_DOG_STATSD_MOGRIFIERS needs a name`},
		{"DOG_STATSD_MOGRIFIER_TAG_PATTERN=( DOG_STATSD_MOGRIFIER_TAG_NAME=x", `DOG_STATSD_MOGRIFIER_TAG_PATTERN="(": not a regular expression`},
		{ok + " DOG_STATSD_MOGRIFIER_TAG_TAGS=:5", `DOG_STATSD_MOGRIFIER_TAG_TAGS=":5": item ":5" has an empty key or value`},
		{ok + " DOG_STATSD_MOGRIFIER_TAG_TAGS=domain:$1,descriptor:", `DOG_STATSD_MOGRIFIER_TAG_TAGS="domain:$1,descriptor:": item "descriptor:" has an empty key or value`},
		{ok + " DOG_STATSD_MOGRIFIER_TAG_TAGS=a:b:c", `item "a:b:c" is not key:value`},
	} {
		_, err := readEnv(append(strings.Fields(tc.env), "USE_DOG_STATSD=true", "USE_DOG_STATSD_MOGRIFIERS=TAG"))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), `USE_DOG_STATSD_MOGRIFIERS="TAG": `) {
			t.Errorf("%s: err = %v, want one naming USE_DOG_STATSD_MOGRIFIERS and saying %s", tc.env, err, tc.want)
		}
	}
	if _, err := readEnv([]string{"USE_DOG_STATSD=true", "USE_DOG_STATSD_MOGRIFIERS=,A"}); err == nil || !strings.Contains(err.Error(), "an empty mogrifier name") {
		t.Errorf("USE_DOG_STATSD_MOGRIFIERS=,A: err = %v, want an empty mogrifier name", err)
	}
	// A mogrifier's variables that the list does not name are ignored.
	s, err := readEnv([]string{"USE_DOG_STATSD=true", "DOG_STATSD_MOGRIFIER_OTHER_PATTERN=x"})
	if err != nil || strings.Join(s.ignored, "|") != "DOG_STATSD_MOGRIFIER_OTHER_PATTERN: "+ignoredWhy("DOG_STATSD_MOGRIFIER_*") {
		t.Errorf("an unlisted mogrifier: err %v, ignored %q", err, s.ignored)
	}
}

// A stat's line, as the reference's sinks write it: StatsD with EXTRA_TAGS
// in the name by tag name (gostats's TagSet.Serialize, values with '.',
// ':' and '|' as '_'); DogStatsD with the client's tags, EXTRA_TAGS and the
// mogrifier's after |# (godogstats's TestSinkMogrify and
// TestSeparateExtraTags).
func TestStatsdLines(t *testing.T) {
	custom := mogrifier{pattern: regexp.MustCompile(`^ratelimit\.(.*)$`), name: "custom.$1", tags: []tag{{"tag1", "value1"}, {"tag2", "value2"}}}
	const stat = "ratelimit.service.rate_limit.mongo_cps.database_users.total_hits"
	for _, tc := range []struct {
		what string
		opts statsdOptions
		name string
		v    uint64
		typ  string
		want string
	}{
		{"StatsD", statsdOptions{}, stat, 3, "c", stat + ":3|c\n"},
		{"StatsD gauge", statsdOptions{}, "ratelimit.localcache.hitCount", 0, "g", "ratelimit.localcache.hitCount:0|g\n"},
		{"StatsD with EXTRA_TAGS", statsdOptions{tags: []tag{{"COMMIT", "12345"}, {"DEPLOY", "67890"}}}, stat, 1, "c", stat + ".__COMMIT=12345.__DEPLOY=67890:1|c\n"},
		{"StatsD with a tag value holding . : |", statsdOptions{tags: []tag{{"a", "b"}, {"foo", "1.2:3|4"}}}, stat, 1, "c", stat + ".__a=b.__foo=1_2_3_4:1|c\n"},
		{"DogStatsD", statsdOptions{dog: true}, stat, 1, "c", stat + ":1|c\n"},
		{"DogStatsD with EXTRA_TAGS", statsdOptions{dog: true, tags: []tag{{"COMMIT", "12345"}, {"DEPLOY", "6890"}}}, stat, 1, "c", stat + ":1|c|#COMMIT:12345,DEPLOY:6890\n"},
		{"DogStatsD mogrified with EXTRA_TAGS", statsdOptions{dog: true, tags: []tag{{"COMMIT", "12345"}, {"DEPLOY", "67890"}}, mogrifiers: []mogrifier{custom}}, stat, 1, "c",
			"custom.service.rate_limit.mongo_cps.database_users.total_hits:1|c|#COMMIT:12345,DEPLOY:67890,tag1:value1,tag2:value2\n"},
		{"DogStatsD mogrified", statsdOptions{dog: true, mogrifiers: []mogrifier{custom}}, stat, 1, "c", "custom.service.rate_limit.mongo_cps.database_users.total_hits:1|c|#tag1:value1,tag2:value2\n"},
		{"DogStatsD, not matched", statsdOptions{dog: true, tags: []tag{{"COMMIT", "12345"}}, mogrifiers: []mogrifier{custom}}, "other.metric.name", 2, "g", "other.metric.name:2|g|#COMMIT:12345\n"},
		{"DogStatsD with the client's tags", statsdOptions{dog: true, globalTags: []string{"env:prod"}, tags: []tag{{"a", "b"}}}, stat, 1, "c", stat + ":1|c|#env:prod,a:b\n"},
	} {
		k := newStatsdSink(tc.opts, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		if got := string(k.appendLine(nil, tc.name, tc.v, tc.typ)); got != tc.want {
			t.Errorf("%s: line %q, want %q", tc.what, got, tc.want)
		}
	}
}

// udpCollector is a StatsD collector on a UDP port of 127.0.0.1.
type udpCollector struct {
	t  *testing.T
	pc net.PacketConn
}

func newUDPCollector(t *testing.T) *udpCollector {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return &udpCollector{t, pc}
}

// lines reads datagrams until it has n lines (10 s at most), checking
// that each datagram holds whole lines and fits statsdDatagram unless it
// is one line.
func (c *udpCollector) lines(n int) []string {
	c.t.Helper()
	var out []string
	buf := make([]byte, 65536)
	c.pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(out) < n {
		m, _, err := c.pc.ReadFrom(buf)
		if err != nil {
			c.t.Fatalf("reading the datagrams: %v (%d lines of %d read: %q)", err, len(out), n, out)
		}
		d := string(buf[:m])
		if !strings.HasSuffix(d, "\n") {
			c.t.Errorf("a datagram does not end with a line's end: %q", d)
		}
		lines := strings.Split(strings.TrimSuffix(d, "\n"), "\n")
		if m > statsdDatagram && len(lines) > 1 {
			c.t.Errorf("a datagram of %d bytes (%d lines), want at most %d", m, len(lines), statsdDatagram)
		}
		out = append(out, lines...)
	}
	return out
}

// flushed flushes k and returns the lines c receives, sorted; none when
// the flush sent nothing.
func flushed(t *testing.T, k *statsdSink, c *udpCollector) []string {
	t.Helper()
	before := counterValue(k.sent)
	k.flush(context.Background())
	n := int(counterValue(k.sent) - before)
	if d := counterValue(k.dropped); d != 0 {
		t.Fatalf("%v lines dropped", d)
	}
	lines := c.lines(n)
	slices.Sort(lines)
	return lines
}

// The sink sends the reference's stats as its StatsD output has them:
// ratelimit.service.rate_limit.<domain>.<key…>.<stat> with what each
// counter gained since the last flush (no line for one that did not move,
// as gostats), the stats key sanitized as the reference sanitizes it
// (':' and '|', an IPv4 address's dots), config_load_success and
// global_shadow_mode under ratelimit.service.
func TestStatsdFlushesTheReferenceStats(t *testing.T) {
	svc, reg := newReferenceService(t, ref{answers: Answers{Shadow: true}})
	c := newUDPCollector(t)
	k := newStatsdSink(statsdOptions{network: "udp", addr: c.pc.LocalAddr().String(), interval: time.Hour}, reg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	const p = "ratelimit.service.rate_limit.d."
	steps := []struct {
		ask  func()
		want []string
	}{
		{func() { ask(t, svc, 8, desc("k", "x")) }, []string{p + "k.total_hits:8|c", p + "k.within_limit:8|c", "ratelimit.service.config_load_success:1|c"}},
		// From 8 to 12 on a limit of 10: 2 over, 2 near; SHADOW_MODE lets
		// the answer through.
		{func() { ask(t, svc, 4, desc("k", "x")) }, []string{p + "k.near_limit:2|c", p + "k.over_limit:2|c", p + "k.total_hits:4|c", "ratelimit.service.global_shadow_mode:1|c"}},
		{func() {}, nil},
		{func() { ask(t, svc, 1, desc("path", "/api/10.1.2.3:80|x")) }, []string{p + "path_/api/10_1_2_3_80_x.total_hits:1|c", p + "path_/api/10_1_2_3_80_x.within_limit:1|c"}},
		{func() { ask(t, svc, 3, desc("parent", "p", "child", "c1")) }, []string{
			// 3 hits on a limit of 1 (near above 0): 1 near, 2 over.
			p + "parent_p.child.near_limit:1|c", p + "parent_p.child.over_limit:2|c", p + "parent_p.child.shadow_mode:2|c", p + "parent_p.child.total_hits:3|c",
		}},
	}
	for i, s := range steps {
		s.ask()
		got := flushed(t, k, c)
		slices.Sort(s.want)
		if !slices.Equal(got, s.want) {
			t.Errorf("step %d: flush sent\n%s\nwant\n%s", i, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
}

// statsFamilies returns a Gatherer of n counters ratelimit_service_rate_limit_total_hits
// of the stats keys d.key_<i> with value i+1, and a gauge.
func statsFamilies(n int) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		counters := &dto.MetricFamily{Name: proto.String("ratelimit_service_rate_limit_total_hits"), Type: dto.MetricType_COUNTER.Enum()}
		for i := range n {
			counters.Metric = append(counters.Metric, &dto.Metric{
				Label: []*dto.LabelPair{
					{Name: proto.String("domain"), Value: proto.String("d")},
					{Name: proto.String("key1"), Value: proto.String(fmt.Sprintf("key_%d", i))},
					{Name: proto.String("key2"), Value: proto.String("")},
				},
				Counter: &dto.Counter{Value: proto.Float64(float64(i + 1))},
			})
		}
		gauge := &dto.MetricFamily{Name: proto.String("ratelimit_localcache_entryCount"), Type: dto.MetricType_GAUGE.Enum(),
			Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: proto.Float64(7)}}}}
		other := &dto.MetricFamily{Name: proto.String("rls_decisions_total"), Type: dto.MetricType_COUNTER.Enum(),
			Metric: []*dto.Metric{{Counter: &dto.Counter{Value: proto.Float64(1)}}}}
		return []*dto.MetricFamily{counters, gauge, other}, nil
	})
}

// wantFamilies are the lines of statsFamilies(n) at a first flush.
func wantFamilies(n int) []string {
	want := []string{"ratelimit.localcache.entryCount:7|g"}
	for i := range n {
		want = append(want, fmt.Sprintf("ratelimit.service.rate_limit.d.key_%d.total_hits:%d|c", i, i+1))
	}
	slices.Sort(want)
	return want
}

// Over UDP a flush is cut into datagrams of whole lines that fit an
// Ethernet frame; over TCP it is a stream of lines. A series that is not
// one of the reference's is not sent.
func TestStatsdNetworks(t *testing.T) {
	const n = 300
	c := newUDPCollector(t)
	k := newStatsdSink(statsdOptions{network: "udp", addr: c.pc.LocalAddr().String()}, statsFamilies(n), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if got := flushed(t, k, c); !slices.Equal(got, wantFamilies(n)) {
		t.Errorf("UDP: %d lines, want %d: %q", len(got), n+1, got)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	k = newStatsdSink(statsdOptions{network: "tcp", addr: ln.Addr().String()}, statsFamilies(n), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	k.flush(context.Background())
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	sc := bufio.NewScanner(conn)
	var got []string
	for len(got) < n+1 && sc.Scan() {
		got = append(got, sc.Text())
	}
	slices.Sort(got)
	if !slices.Equal(got, wantFamilies(n)) || counterValue(k.sent) != n+1 {
		t.Errorf("TCP: %d lines (%v sent; %v), want %d", len(got), counterValue(k.sent), sc.Err(), n+1)
	}
}

// A collector that cannot be reached costs the flush's lines, counted as
// dropped; the counters move on as gostats's do, and the next flush dials
// again.
func TestStatsdCollectorDown(t *testing.T) {
	c := newUDPCollector(t)
	k := newStatsdSink(statsdOptions{network: "udp", addr: c.pc.LocalAddr().String()}, statsFamilies(3), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	dial := k.dial
	dials := 0
	k.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials++; dials == 1 {
			return nil, errors.New("connection refused")
		}
		return dial(ctx, network, addr)
	}
	k.flush(context.Background())
	if d, s := counterValue(k.dropped), counterValue(k.sent); d != 4 || s != 0 {
		t.Errorf("a flush that cannot dial: %v dropped, %v sent; want 4, 0", d, s)
	}
	k.dropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"})
	if got := flushed(t, k, c); !slices.Equal(got, []string{"ratelimit.localcache.entryCount:7|g"}) {
		t.Errorf("the next flush sent %q, want the gauge alone (the counters did not move)", got)
	}
}

// A collector that does not read never holds a decision: while a flush
// waits on it, decisions go on and count; the flush's lines are dropped
// when its write fails. (Decisions only count into the stats' series; the
// sink reads them on its own goroutine.)
func TestStatsdSlowCollectorNeverBlocksDecisions(t *testing.T) {
	svc, reg := newReferenceService(t, ref{})
	k := newStatsdSink(statsdOptions{network: "tcp", addr: "collector:8125"}, reg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	k.writeTimeout = time.Hour // the test ends the write
	client, collector := net.Pipe()
	dialled := make(chan struct{})
	k.dial = func(context.Context, string, string) (net.Conn, error) {
		close(dialled)
		return client, nil
	}
	ask(t, svc, 1, desc("k", "x"))
	done := make(chan struct{})
	go func() {
		k.flush(context.Background())
		close(done)
	}()
	<-dialled
	for i := range 50 {
		if got := ask(t, svc, 1, desc("path", fmt.Sprintf("/api/%d", i))).Code; got != service.OK {
			t.Fatalf("decision %d while the flush waits: %v, want OK", i, got)
		}
	}
	select {
	case <-done:
		t.Fatal("the flush returned while its collector had read nothing")
	default:
	}
	collector.Close()
	<-done
	// The flush read the stats before it dialled: k=x's total_hits and
	// within_limit, and config_load_success.
	if d, s := counterValue(k.dropped), counterValue(k.sent); d != 3 || s != 0 {
		t.Errorf("after the collector went away unread: %v dropped, %v sent; want 3, 0", d, s)
	}
	if c, err := refCounter(reg, "ratelimit_service_rate_limit_total_hits", "d", "path_/api/0", ""); err != nil || c != 1 {
		t.Errorf("a decision made while the flush waited did not count: total_hits = %v (%v)", c, err)
	}
}

// run flushes every interval, and once more when its context ends, then
// closes its connection.
func TestStatsdRun(t *testing.T) {
	c := newUDPCollector(t)
	k := newStatsdSink(statsdOptions{network: "udp", addr: c.pc.LocalAddr().String(), interval: time.Millisecond}, statsFamilies(1), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		k.run(ctx)
		close(done)
	}()
	// Each flush sends the gauge: three flushes, three of its lines.
	var gauges int
	for gauges < 3 {
		for _, l := range c.lines(1) {
			if l == "ratelimit.localcache.entryCount:7|g" {
				gauges++
			}
		}
	}
	cancel()
	<-done
	if k.conn != nil {
		t.Error("run returned with its connection open")
	}

	// An interval that never comes: the lines come at the end.
	c = newUDPCollector(t)
	k = newStatsdSink(statsdOptions{network: "udp", addr: c.pc.LocalAddr().String(), interval: time.Hour}, statsFamilies(1), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	k.run(ctx)
	if got := c.lines(2); !slices.Contains(got, "ratelimit.service.rate_limit.d.key_0.total_hits:1|c") {
		t.Errorf("the last flush sent %q", got)
	}
}

// A counter sends what it gained since the last flush; one lower than at
// the last flush was made anew (a reload dropped its stats key and a later
// one brought it back) and gained all its value.
func TestStatsdCounterGains(t *testing.T) {
	var value float64
	src := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		return []*dto.MetricFamily{{Name: proto.String("ratelimit_service_config_load_success"), Type: dto.MetricType_COUNTER.Enum(),
			Metric: []*dto.Metric{{Counter: &dto.Counter{Value: proto.Float64(value)}}}}}, nil
	})
	c := newUDPCollector(t)
	k := newStatsdSink(statsdOptions{network: "udp", addr: c.pc.LocalAddr().String()}, src, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	for i, s := range []struct {
		value float64
		want  []string
	}{
		{5, []string{"ratelimit.service.config_load_success:5|c"}},
		{7, []string{"ratelimit.service.config_load_success:2|c"}},
		{7, nil},
		{2, []string{"ratelimit.service.config_load_success:2|c"}},
		{3, []string{"ratelimit.service.config_load_success:1|c"}},
	} {
		value = s.value
		if got := flushed(t, k, c); !slices.Equal(got, s.want) {
			t.Errorf("step %d: counter at %v: flush sent %q, want %q", i, s.value, got, s.want)
		}
	}
}
