package decisionmetrics

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

// metricsFixture is a service on a memory store at a fixed instant,
// observed by its metrics in a registry of their own.
type metricsFixture struct {
	svc *service.Service
	m   *Metrics
	reg *prometheus.Registry
}

func newMetricsFixture(t *testing.T, maxValues int) *metricsFixture {
	t.Helper()
	ms := memstore.New(memstore.Options{Now: storetest.NewClock(storetest.T0).Now})
	t.Cleanup(func() { ms.Close() })
	reg := prometheus.NewPedanticRegistry()
	svc, m := observed(reg, service.Options{Store: ms}, Options{MaxValueSeries: maxValues})
	return &metricsFixture{svc: svc, m: m, reg: reg}
}

func (f *metricsFixture) load(t *testing.T, yaml string) {
	t.Helper()
	cfg, err := config.Parse("m.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	f.svc.SetConfig(cfg)
}

func (f *metricsFixture) ask(t *testing.T, domain string, kv ...string) {
	t.Helper()
	if _, err := f.svc.ShouldRateLimit(context.Background(), &service.Request{Domain: domain, Descriptors: []service.Descriptor{desc(kv...)}}); err != nil {
		t.Fatal(err)
	}
}

// series returns the series of the counter, gauge or histogram name as
// "label=value,… value", sorted (a histogram's value: its count).
func (f *metricsFixture) series(t *testing.T, name string) []string {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			out = append(out, seriesString(m))
		}
	}
	sort.Strings(out)
	return out
}

func seriesString(m *dto.Metric) string {
	var parts []string
	for _, lp := range m.GetLabel() {
		parts = append(parts, lp.GetName()+"="+lp.GetValue())
	}
	v := m.GetCounter().GetValue()
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		v = float64(m.GetHistogram().GetSampleCount())
	}
	return strings.Join(parts, ",") + fmt.Sprintf(" %g", v)
}

// TestSeriesMadeOnFirstUse: loading a config makes no per-limit series; a
// decision makes the series of its limit and verdict only.
func TestSeriesMadeOnFirstUse(t *testing.T) {
	f := newMetricsFixture(t, 0)
	f.load(t, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	if got := f.series(t, "rls_decisions_total"); len(got) != 0 {
		t.Fatalf("after loading: %v, want no series", got)
	}
	f.ask(t, "d", "a", "1")
	f.ask(t, "d", "a", "1")
	want := []string{"domain=d,limit=a/1h,result=ok 1", "domain=d,limit=a/1h,result=over_limit 1"}
	if got := f.series(t, "rls_decisions_total"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after two requests on a: %v, want %v", got, want)
	}
	if got := f.series(t, "rls_shadow_denials_total"); len(got) != 0 {
		t.Errorf("rls_shadow_denials_total: %v, want no series (no shadow limit decided)", got)
	}
}

// TestReloadDropsSeriesOfRemovedLimits is the regression test of the leak
// that took 20 reloads of a 5,000-descriptor config whose values changed
// from 61 to 704 MiB: the series of limits that a reload drops are deleted,
// those of limits it keeps go on counting.
func TestReloadDropsSeriesOfRemovedLimits(t *testing.T) {
	f := newMetricsFixture(t, 0)
	config := func(round int) string {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors:\n  - key: kept\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
		for i := range 50 {
			fmt.Fprintf(&b, "  - key: k\n    value: r%dv%d\n    rate_limit: {unit: minute, requests_per_unit: 10}\n", round, i)
		}
		return b.String()
	}
	for round := range 20 {
		f.load(t, config(round))
		f.ask(t, "d", "kept", "x")
		for i := range 50 {
			f.ask(t, "d", "k", fmt.Sprintf("r%dv%d", round, i))
		}
		if got := len(f.series(t, "rls_decisions_total")); got != 51 {
			t.Fatalf("round %d: %d series, want 51 (the limits of this round's config)", round, got)
		}
	}
	if got := f.series(t, "rls_decisions_total"); !strings.Contains(fmt.Sprint(got), "domain=d,limit=kept/1h,result=ok 20") {
		t.Errorf("the kept limit's series did not count across the reloads: %v", got)
	}
}

// TestLateRequestMakesNoDeletedSeries: a request still on the config that a
// reload replaced does not make again the series the reload deleted.
func TestLateRequestMakesNoDeletedSeries(t *testing.T) {
	f := newMetricsFixture(t, 0)
	f.load(t, "domain: d\ndescriptors:\n  - key: old\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	old := f.m.current.Load()
	f.load(t, "domain: d\ndescriptors:\n  - key: new\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	old.counters[0].count(resultOK, nil, nil)
	if got := f.series(t, "rls_decisions_total"); len(got) != 0 {
		t.Errorf("a late count on the old config made %v, want nothing", got)
	}
}

const perValueConfig = `
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: ip
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: path
    value: /api/*
    descriptors:
      - key: user
        value_to_metric: true
        rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tenant
    value_to_metric: true
    descriptors:
      - key: plan
        value: gold
        descriptors:
          - key: user
            detailed_metric: true
            value_to_metric: true
            rate_limit: {unit: hour, requests_per_unit: 100}
`

// TestPerValueSeries: detailed_metric labels the series with the request's
// values at every level, value_to_metric with the value at its level (a
// configured value, or a wildcard's pattern, elsewhere), as
// envoyproxy/ratelimit names its stats; other limits have no per-value
// series.
func TestPerValueSeries(t *testing.T) {
	f := newMetricsFixture(t, 0)
	f.load(t, perValueConfig)
	f.ask(t, "d", "plain", "a")
	f.ask(t, "d", "ip", "203.0.113.7")
	f.ask(t, "d", "ip", "203.0.113.7")
	f.ask(t, "d", "ip", "203.0.113.8")
	f.ask(t, "d", "path", "/api/v1", "user", "alice")
	f.ask(t, "d", "tenant", "t1", "plan", "gold", "user", "bob")
	f.ask(t, "d", "ip", "bad\xff/"+strings.Repeat("x", 100))
	want := []string{
		"descriptor=ip=203.0.113.7,domain=d,limit=ip/1h,result=ok 2",
		"descriptor=ip=203.0.113.8,domain=d,limit=ip/1h,result=ok 1",
		"descriptor=ip=bad\uFFFD/" + strings.Repeat("x", 43) + "…#", // a long or invalid value: shortened, with a hash
		"descriptor=path=/api/*/user=alice,domain=d,limit=path=/api/*/user/1h,result=ok 1",
		"descriptor=tenant=t1/plan=gold/user=bob,domain=d,limit=tenant/plan=gold/user/1h,result=ok 1",
	}
	got := f.series(t, "rls_descriptor_decisions_total")
	if len(got) != len(want) {
		t.Fatalf("per-value series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("series %d = %q, want %q…", i, got[i], want[i])
		}
	}
	// The aggregate series count every value.
	if agg := fmt.Sprint(f.series(t, "rls_decisions_total")); !strings.Contains(agg, "domain=d,limit=ip/1h,result=ok 4") {
		t.Errorf("rls_decisions_total = %s, want limit ip/1h ok 4", agg)
	}
}

// TestPerValueSeriesBounded: past MaxValueSeries distinct values of a
// limit, decisions fold into one series, counted; a reload that keeps the
// limit keeps its series, one that drops the flag deletes them.
func TestPerValueSeriesBounded(t *testing.T) {
	const max, values = 5, 40
	f := newMetricsFixture(t, max)
	f.load(t, perValueConfig)
	for i := range values {
		f.ask(t, "d", "ip", fmt.Sprint("198.51.100.", i))
	}
	got := f.series(t, "rls_descriptor_decisions_total")
	if len(got) != max+1 || !strings.HasPrefix(got[0], "descriptor="+OtherSeries+",") || !strings.HasSuffix(got[0], fmt.Sprintf(" %d", values-max)) {
		t.Fatalf("%d values of a limit with a bound of %d: %v; want %d series and %s counting %d", values, max, got, max+1, OtherSeries, values-max)
	}
	f.load(t, perValueConfig+"  - key: more\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	if again := f.series(t, "rls_descriptor_decisions_total"); fmt.Sprint(again) != fmt.Sprint(got) {
		t.Errorf("after a reload that keeps the limit: %v, want %v", again, got)
	}
	f.load(t, strings.ReplaceAll(perValueConfig, "detailed_metric: true\n    rate_limit", "rate_limit"))
	for _, s := range f.series(t, "rls_descriptor_decisions_total") {
		if strings.Contains(s, "limit=ip/1h") {
			t.Errorf("after a reload that drops detailed_metric: %s still there", s)
		}
	}
}

// BenchmarkScrape is one /metrics scrape's worth of gathering and encoding
// for a config of 100,000 descriptors on which 1,000 decided.
func BenchmarkScrape(b *testing.B) {
	var y strings.Builder
	y.WriteString("domain: big\ndescriptors:\n")
	for i := range 100_000 {
		fmt.Fprintf(&y, "  - key: k\n    value: v%d\n    rate_limit: {unit: minute, requests_per_unit: 10}\n", i)
	}
	cfg, err := config.Parse("big.yaml", []byte(y.String()))
	if err != nil {
		b.Fatal(err)
	}
	ms := memstore.New(memstore.Options{})
	b.Cleanup(func() { ms.Close() })
	reg := prometheus.NewRegistry()
	svc, _ := observed(reg, service.Options{Store: ms}, Options{})
	svc.SetConfig(cfg)
	for i := range 1000 {
		svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "big", Descriptors: []service.Descriptor{desc("k", fmt.Sprint("v", i))}})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSetConfig is a reload of a config of 20,000 limits, half of
// them in the previous config (kept) and half not (deleted), on which
// every limit had decided, with the reference's stats.
func BenchmarkSetConfig(b *testing.B) {
	configs := make([]*config.Config, 2)
	reqs := make([][]*service.Request, 2)
	for c := range configs {
		var y strings.Builder
		y.WriteString("domain: big\ndescriptors:\n")
		for i := range 20_000 {
			v := fmt.Sprint("kept", i)
			if i%2 == 1 {
				v = fmt.Sprint("config", c, "-", i)
			}
			fmt.Fprintf(&y, "  - key: k\n    value: %s\n    rate_limit: {unit: minute, requests_per_unit: 10}\n", v)
			reqs[c] = append(reqs[c], &service.Request{Domain: "big", Descriptors: []service.Descriptor{desc("k", v)}})
		}
		cfg, err := config.Parse("big.yaml", []byte(y.String()))
		if err != nil {
			b.Fatal(err)
		}
		configs[c] = cfg
	}
	ms := memstore.New(memstore.Options{})
	b.Cleanup(func() { ms.Close() })
	svc, _ := observed(prometheus.NewRegistry(), service.Options{Store: ms}, Options{})
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		b.StopTimer()
		for _, req := range reqs[(n+1)%2] {
			svc.ShouldRateLimit(context.Background(), req)
		}
		b.StartTimer()
		svc.SetConfig(configs[n%2])
	}
}

// Counting into a request-valued series that exists allocates nothing: no
// label is built as a string (rls's detailed_metric series, and those of
// request overrides).
func TestPerValueCountAllocatesNothing(t *testing.T) {
	cfg, err := config.Parse("pv.yaml", []byte(perValueConfig))
	if err != nil {
		t.Fatal(err)
	}
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { ms.Close() })
	svc, m := observed(prometheus.NewRegistry(), service.Options{Store: ms}, Options{MaxValueSeries: 2})
	svc.SetConfig(cfg)
	cur := m.current.Load()
	perValue := []config.Entry{{Key: "ip", Value: "10.0.0.1"}}
	l := cfg.Domain("d").Match(perValue).Limits[0]
	over := []config.Entry{{Key: "o", Value: "v"}}
	var buf []byte
	count := func() {
		buf = cur.counters[l.Index].count(resultOK, perValue, buf)
		buf = cur.override["d"].count(resultOK, over, buf)
	}
	count() // makes the series and grows buf
	if n := testing.AllocsPerRun(100, count); n != 0 {
		t.Errorf("counting a detailed_metric descriptor and an override: %v allocations, want 0", n)
	}
}
