package compat

import (
	"context"
	"math"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/httpdesc"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/series"
	"github.com/rlsproject/rls/internal/service"
)

const referenceConfig = `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
    metadata: {route: a, shared: first}
  - key: svc
    value: b
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {route: b, shared: second, extra: 1}
  - key: path
    value: /api/*
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: parent
    value: p
    descriptors:
      - key: child
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
`

// ref says what of the reference a test service has: its stats (with the
// near-limit ratio and a local cache or none; stats are on unless
// noStats) and its answer rules.
type ref struct {
	noStats    bool
	ratio      float64
	localCache bool
	answers    Answers
}

// plug adds what r asks for to opts, registering the stats in reg with
// maxValues; it returns the stats (nil when off).
func (r ref) plug(opts *service.Options, reg *prometheus.Registry, maxValues int) *Stats {
	var st *Stats
	if !r.noStats {
		st = NewStats(reg, StatsOptions{NearLimitRatio: r.ratio, MaxValues: maxValues, LocalCache: r.localCache})
		opts.Observers = append(opts.Observers, st)
	}
	a := r.answers
	a.Stats = st
	opts.AnswerRules = append(opts.AnswerRules, &a)
	return st
}

func newReferenceService(t *testing.T, r ref) (*service.Service, *prometheus.Registry) {
	t.Helper()
	return newReferenceServiceWith(t, service.Options{}, r)
}

// newReferenceServiceWith is newReferenceService with more options; the
// store, registry and MaxValueSeries (2) are its own.
func newReferenceServiceWith(t *testing.T, opts service.Options, r ref) (*service.Service, *prometheus.Registry) {
	t.Helper()
	return newReferenceServiceFrom(t, referenceConfig, opts, r, 2)
}

func ask(t *testing.T, svc *service.Service, hits uint32, ds ...service.Descriptor) *service.Response {
	t.Helper()
	resp, err := svc.ShouldRateLimit(context.Background(), &service.Request{Domain: "d", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func desc(kv ...string) service.Descriptor {
	var d service.Descriptor
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func headerText(h []service.Header) string {
	var b []string
	for _, x := range h {
		b = append(b, x.Key+": "+x.Value)
	}
	return strings.Join(b, ", ")
}

// The reference's per-limit stats split a request's hits as it does: from
// 7 to 12 on a limit of 10 (near limit above 8) counts 2 over and 2 near.
func TestReferenceStats(t *testing.T) {
	svc, reg := newReferenceService(t, ref{})
	steps := []struct {
		hits uint32
		want service.Code
	}{{7, service.OK}, {5, service.OverLimit}}
	for i, s := range steps {
		if got := ask(t, svc, s.hits, desc("k", "x")).Code; got != s.want {
			t.Fatalf("step %d: ShouldRateLimit(k=x, hits=%d) = %v, want %v", i, s.hits, got, s.want)
		}
	}
	for _, tc := range []struct {
		metric string
		want   float64
	}{
		{"total_hits", 12}, {"within_limit", 7}, {"over_limit", 2}, {"near_limit", 2},
	} {
		c, err := refCounter(reg, "ratelimit_service_rate_limit_"+tc.metric, "d", "k", "")
		if err != nil || c != tc.want {
			t.Errorf("%s{domain=d,key1=k} = %v (%v), want %v", tc.metric, c, err, tc.want)
		}
	}
	// A wildcard shows its pattern; detailed_metric the request's value,
	// at most MaxValueSeries (2) of them, then _other.
	for _, v := range []string{"/api/a", "/api/b", "/api/c"} {
		ask(t, svc, 1, desc("path", v))
	}
	for _, tc := range []struct{ key1 string }{{"path_/api/a"}, {"path_/api/b"}, {series.Other}} {
		if c, err := refCounter(reg, "ratelimit_service_rate_limit_total_hits", "d", tc.key1, ""); err != nil || c != 1 {
			t.Errorf("total_hits{key1=%q} = %v (%v), want 1", tc.key1, c, err)
		}
	}
	// Two levels: key2; a shadow limit's hits over it count in shadow_mode.
	ask(t, svc, 3, desc("parent", "p", "child", "c1"))
	if c, err := refCounter(reg, "ratelimit_service_rate_limit_shadow_mode", "d", "parent_p", "child"); err != nil || c != 2 {
		t.Errorf("shadow_mode{key1=parent_p,key2=child} = %v (%v), want 2", c, err)
	}
	if c := plainCounter(t, reg, "ratelimit_service_config_load_success"); c != 1 {
		t.Errorf("ratelimit_service_config_load_success = %v, want 1", c)
	}
}

func refCounter(reg *prometheus.Registry, name, domain, key1, key2 string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["domain"] == domain && l["key1"] == key1 && l["key2"] == key2 {
				return m.GetCounter().GetValue(), nil
			}
		}
	}
	return 0, nil
}

// SHADOW_MODE turns a denial into service.OK and keeps the statuses; QUOTA_MODE
// denies only when every descriptor is over; the limit headers come from
// the least remaining, or the last denying status; metadata of the
// descriptors that passed is merged, first value winning.
func TestReferenceAnswers(t *testing.T) {
	svc, reg := newReferenceService(t, ref{answers: Answers{Shadow: true, LimitHeaders: &DefaultLimitHeaderNames, DynamicMetadata: true}})
	r1 := ask(t, svc, 1, desc("k", "x"), desc("svc", "b"))
	if r1.Code != service.OK || headerText(r1.Headers) != "RateLimit-Limit: 1, RateLimit-Remaining: 0, RateLimit-Reset: 60" {
		t.Errorf("first request: %v, headers %q", r1.Code, headerText(r1.Headers))
	}
	if md, _ := r1.Metadata["metadata"].(map[string]any); md["route"] != "a" || md["shared"] != "first" || md["extra"] != float64(1) {
		t.Errorf("first request's metadata = %v, want route a, shared first, extra 1", r1.Metadata)
	}
	r2 := ask(t, svc, 1, desc("k", "x"), desc("svc", "b"))
	if r2.Code != service.OK || r2.Statuses[1].Code != service.OverLimit {
		t.Errorf("second request under SHADOW_MODE: overall %v, svc=b %v; want service.OK and OVER_LIMIT", r2.Code, r2.Statuses[1].Code)
	}
	if md, _ := r2.Metadata["metadata"].(map[string]any); md["route"] != "a" || md["extra"] != nil {
		t.Errorf("second request's metadata = %v, want only k's (svc=b is over)", r2.Metadata)
	}
	if c := plainCounter(t, reg, "ratelimit_service_global_shadow_mode"); c != 1 {
		t.Errorf("ratelimit_service_global_shadow_mode = %v, want 1", c)
	}

	q, _ := newReferenceServiceWith(t, service.Options{QuotaAll: true}, ref{noStats: true})
	ask(t, q, 1, desc("svc", "b"))
	if got := ask(t, q, 1, desc("svc", "b"), desc("k", "x")).Code; got != service.OK {
		t.Errorf("QUOTA_MODE, one of two descriptors over: %v, want service.OK", got)
	}
	if got := ask(t, q, 1, desc("svc", "b")).Code; got != service.OverLimit {
		t.Errorf("QUOTA_MODE, the only descriptor over: %v, want OVER_LIMIT", got)
	}
}

// A reload deletes the reference's series of the stats keys it drops, its
// value sets' included, and keeps those of the keys it keeps.
func TestReferenceStatsReload(t *testing.T) {
	svc, reg := newReferenceService(t, ref{})
	ask(t, svc, 1, desc("k", "x"))
	ask(t, svc, 1, desc("svc", "b"))
	for _, v := range []string{"/api/a", "/api/b", "/api/c"} {
		ask(t, svc, 1, desc("path", v))
	}
	cfg, err := config.Parse("ref.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Reload(func() (*config.Config, error) { return cfg, nil }); err != nil {
		t.Fatal(err)
	}
	ask(t, svc, 1, desc("k", "x"))
	for _, tc := range []struct {
		key1 string
		want float64 // 0: no series
	}{{"k", 2}, {"svc_b", 0}, {"path_/api/a", 0}, {series.Other, 1}} {
		if c, err := refCounter(reg, "ratelimit_service_rate_limit_total_hits", "d", tc.key1, ""); err != nil || c != tc.want {
			t.Errorf("after the reload: total_hits{key1=%q} = %v (%v), want %v", tc.key1, c, err, tc.want)
		}
	}
	// The domain's _other series goes with the domain.
	other, err := config.Parse("other.yaml", []byte("domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Reload(func() (*config.Config, error) { return other, nil }); err != nil {
		t.Fatal(err)
	}
	for _, key1 := range []string{"k", series.Other} {
		if c, err := refCounter(reg, "ratelimit_service_rate_limit_total_hits", "d", key1, ""); err != nil || c != 0 {
			t.Errorf("domain d dropped: total_hits{domain=d,key1=%q} = %v (%v), want no series", key1, c, err)
		}
	}
}

// SHADOW_MODE turns an answer service.OK before its headers are written: an service.OK
// answer carries no Retry-After (ext_authz would add it to the client's
// successful response, and /auth would send it with a 200), and keeps the
// limit headers.
func TestGlobalShadowNoRetryAfter(t *testing.T) {
	svc, _ := newReferenceServiceWith(t, service.Options{Headers: service.HeadersBoth}, ref{noStats: true, answers: Answers{Shadow: true}})
	ask(t, svc, 1, desc("svc", "b"))
	r := ask(t, svc, 1, desc("svc", "b")) // over its limit of 1 per minute
	text := headerText(r.Headers)
	if r.Code != service.OK || strings.Contains(text, "Retry-After") || !strings.Contains(text, "RateLimit: ") {
		t.Errorf("over the limit under SHADOW_MODE: %v with headers %q; want service.OK, the limit headers, no Retry-After", r.Code, text)
	}
}

// plainCounter returns the value of the counter called name (without
// labels) in reg.
func plainCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// refCounters returns the counters of reg by name and key1 ("name/key1").
func refCounters(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, p := range m.GetLabel() {
				if p.GetName() == "key1" {
					out[mf.GetName()+"/"+p.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// newReferenceServiceFrom is newReferenceServiceWith for the config text,
// with maxValues (0: the default) request-valued series per stats key.
func newReferenceServiceFrom(t *testing.T, limitsYAML string, opts service.Options, r ref, maxValues int) (*service.Service, *prometheus.Registry) {
	t.Helper()
	cfg, err := config.Parse("ref.yaml", []byte(limitsYAML))
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(storetest.T0)
	ms := memstore.New(memstore.Options{Now: clock.Now})
	t.Cleanup(func() { ms.Close() })
	reg := prometheus.NewRegistry()
	opts.Store = ms
	opts.Observers = append(opts.Observers, decisionmetrics.New(reg, decisionmetrics.Options{MaxValueSeries: maxValues}))
	r.plug(&opts, reg, maxValues)
	svc := service.New(opts)
	if err := svc.Reload(func() (*config.Config, error) { return cfg, nil }); err != nil {
		t.Fatal(err)
	}
	return svc, reg
}

// refModelStats are envoyproxy/ratelimit's five counters of one stats key.
type refModelStats struct{ total, over, near, within, shadow float64 }

// count adds a request of hits that took the key's counter from before to
// before+hits, as the reference's base limiter does (GetResponseDescriptorStatus,
// checkOverLimitThreshold, checkNearLimitThreshold, increaseShadowModeStats),
// with its float32 near-limit threshold.
func (m *refModelStats) count(limit uint64, ratio float32, before, hits uint64, shadow bool) {
	after := before + hits
	near := uint64(math.Floor(float64(float32(limit) * ratio)))
	m.total += float64(hits)
	if after > limit {
		over := hits
		if before < limit {
			over = after - limit
			m.near += float64(limit - max(near, before))
		}
		m.over += float64(over)
		if shadow {
			m.shadow += float64(over)
		}
		return
	}
	m.within += float64(hits)
	if after > near {
		m.near += float64(after - max(near, before))
	}
}

// The reference's stats split a denial that crosses the limit when denied
// hits count (compatibility mode's default): from 8 to 12 on a limit of 10
// (near above 8) is 2 over and 2 near. rls read a denied item's remaining
// after its charge, so all 4 went to over and none to near.
func TestReferenceStatsSplitCountedDenial(t *testing.T) {
	svc, reg := newReferenceServiceWith(t, service.Options{CountDeniedHits: true}, ref{})
	ask(t, svc, 8, desc("k", "x"))
	if got := ask(t, svc, 4, desc("k", "x")).Code; got != service.OverLimit {
		t.Fatalf("ShouldRateLimit(k=x, hits=4) after 8 of 10 = %v, want OVER_LIMIT", got)
	}
	for _, tc := range []struct {
		metric string
		want   float64
	}{
		{"total_hits", 12}, {"within_limit", 8}, {"over_limit", 2}, {"near_limit", 2},
	} {
		if c, err := refCounter(reg, "ratelimit_service_rate_limit_"+tc.metric, "d", "k", ""); err != nil || c != tc.want {
			t.Errorf("8 then 4 hits on a limit of 10, denied hits counted: %s{domain=d,key1=k} = %v (%v), want %v", tc.metric, c, err, tc.want)
		}
	}
}

// The near-limit threshold is the reference's float32 product
// (NEAR_LIMIT_RATIO is a float32 there): 90 × 0.7 is 63, where float64
// arithmetic gives 62.99… and 62, so that a 63rd hit counted as near.
func TestReferenceStatsNearThresholdFloat32(t *testing.T) {
	svc, reg := newReferenceServiceFrom(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 90}\n",
		service.Options{CountDeniedHits: true}, ref{ratio: 0.7}, 0)
	ask(t, svc, 62, desc("k", "x"))
	ask(t, svc, 1, desc("k", "x"))
	if c, err := refCounter(reg, "ratelimit_service_rate_limit_near_limit", "d", "k", ""); err != nil || c != 0 {
		t.Errorf("62 then 1 hit on a limit of 90, NEAR_LIMIT_RATIO 0.7 (threshold 63): near_limit = %v (%v), want 0", c, err)
	}
	ask(t, svc, 1, desc("k", "x"))
	if c, err := refCounter(reg, "ratelimit_service_rate_limit_near_limit", "d", "k", ""); err != nil || c != 1 {
		t.Errorf("a 64th hit: near_limit = %v (%v), want 1", c, err)
	}
}

// Random requests against a model of the reference's counters and stats
// (one counter per key, every hit counted, as its INCRBY): rls's series
// say what the reference's would, for plain, shadow and several limits,
// whatever the NEAR_LIMIT_RATIO. (Before the fix, seeds failed within a few
// steps: a denial that crossed the limit counted no near_limit hits.)
func TestReferenceStatsDifferential(t *testing.T) {
	const limitsYAML = `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 90}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 7}
`
	seed := storetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	ratio := []float32{0.5, 0.7, 0.8, 0.95}[rng.IntN(4)]
	svc, reg := newReferenceServiceFrom(t, limitsYAML, service.Options{CountDeniedHits: true}, ref{ratio: float64(ratio)}, 0)
	keys := []struct {
		key    string
		limit  uint64
		shadow bool
	}{{"a", 10, false}, {"b", 90, false}, {"s", 7, true}}
	model := make([]refModelStats, len(keys))
	counters := make([]uint64, len(keys))
	for step := range 300 {
		// Distinct keys: of a request that names one counter twice, rls
		// knows only the state after both (see refStats.record).
		var ds []service.Descriptor
		which := rng.Perm(len(keys))[:1+rng.IntN(len(keys))]
		for _, k := range which {
			ds = append(ds, desc(keys[k].key, "x"))
		}
		hits := uint64(1 + rng.IntN(6))
		if rng.IntN(10) == 0 {
			hits = uint64(1 + rng.IntN(40))
		}
		ask(t, svc, uint32(hits), ds...)
		for _, k := range which {
			model[k].count(keys[k].limit, ratio, counters[k], hits, keys[k].shadow)
			counters[k] += hits
		}
		got := refCounters(t, reg)
		for k, key := range keys {
			m := model[k]
			for _, c := range []struct {
				metric string
				want   float64
			}{{"total_hits", m.total}, {"over_limit", m.over}, {"near_limit", m.near}, {"within_limit", m.within}, {"shadow_mode", m.shadow}} {
				if g := got["ratelimit_service_rate_limit_"+c.metric+"/"+key.key]; g != c.want {
					t.Fatalf("step %d (seed %d, NEAR_LIMIT_RATIO %v): %s{key1=%s} = %v, want %v (the counter is at %d of %d)",
						step, seed, ratio, c.metric, key.key, g, c.want, counters[k], key.limit)
				}
			}
		}
	}
}

// cachedDenials is a store whose every answer is a denial from a denial
// cache (as the Redis store's, once a counter is known to be over).
type cachedDenials struct{}

func (cachedDenials) Apply(_ context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	for i := range items {
		results[i] = engine.Result{Cached: true, RetryAfter: time.Minute, Reset: time.Minute}
	}
	return false, nil
}

func (c cachedDenials) Peek(ctx context.Context, items []engine.Item, results []engine.Result) (bool, error) {
	return c.Apply(ctx, items, results)
}

func (cachedDenials) Reset(context.Context, []engine.Item) (int, error) { return 0, nil }
func (cachedDenials) Ping(context.Context) error                        { return nil }

// A denial answered from the denial cache counts, as one answered from the
// reference's local cache, in over_limit and over_limit_with_local_cache
// (with no near_limit share); the series was not exported.
func TestReferenceStatsOverLimitWithLocalCache(t *testing.T) {
	cfg, err := config.Parse("ref.yaml", []byte(referenceConfig))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts := service.Options{Store: cachedDenials{}, CountDeniedHits: true, Observers: []service.Observer{decisionmetrics.New(reg, decisionmetrics.Options{})}}
	ref{localCache: true}.plug(&opts, reg, 0)
	svc := service.New(opts)
	svc.SetConfig(cfg)
	if got := ask(t, svc, 3, desc("k", "x")).Code; got != service.OverLimit {
		t.Fatalf("ShouldRateLimit(k=x, hits=3) from the denial cache = %v, want OVER_LIMIT", got)
	}
	got := refCounters(t, reg)
	for metric, want := range map[string]float64{"total_hits": 3, "over_limit": 3, "over_limit_with_local_cache": 3, "near_limit": 0, "within_limit": 0} {
		if g := got["ratelimit_service_rate_limit_"+metric+"/k"]; g != want {
			t.Errorf("3 hits denied from the denial cache: %s{key1=k} = %v, want %v", metric, g, want)
		}
	}
}

// Without a local cache the reference has no over_limit_with_local_cache
// stat: rls exported it, at 0, beside each key's other series. With one,
// it is there from a key's first hit, as the key's other series.
func TestReferenceStatsLocalCacheSeriesOnlyWithCache(t *testing.T) {
	for _, cache := range []bool{false, true} {
		svc, reg := newReferenceService(t, ref{localCache: cache})
		for range 12 { // within, near and over the limit of 10
			ask(t, svc, 1, desc("k", "x"))
		}
		got := refCounters(t, reg)
		if g := got["ratelimit_service_rate_limit_over_limit/k"]; g != 2 {
			t.Errorf("local cache %v: over_limit{key1=k} = %v, want 2", cache, g)
		}
		g, ok := got["ratelimit_service_rate_limit_over_limit_with_local_cache/k"]
		if ok != cache || g != 0 {
			t.Errorf("local cache %v: over_limit_with_local_cache{key1=k} = %v (present %v), want present %v, 0", cache, g, ok, cache)
		}
	}
}

// TestReferenceStatsInvalidUTF8Value is the regression test of a panic: a
// request value that is not valid UTF-8 (a header that /auth or ext_authz
// read into a detailed_metric descriptor) went into a label of the
// reference's stats as it was, and Prometheus panics on such a label value.
// It is counted under the value made valid (U+FFFD for the bad bytes).
func TestReferenceStatsInvalidUTF8Value(t *testing.T) {
	svc, reg := newReferenceServiceFrom(t, `
domain: d
http_descriptors:
  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`, service.Options{}, ref{}, 0)
	resp, err := svc.CheckHTTP(context.Background(), "d", &httpdesc.StaticRequest{Headers: map[string]string{"x-user": "bob\xff"}, Client: netip.MustParseAddr("192.0.2.1")})
	if err != nil || resp.Code != service.OK {
		t.Fatalf("CheckHTTP(x-user: bob\\xff) = %v, %v; want service.OK", resp, err)
	}
	if c, err := refCounter(reg, "ratelimit_service_rate_limit_total_hits", "d", "user_bob\uFFFD", ""); err != nil || c != 1 {
		t.Errorf("total_hits{key1=user_bob\\uFFFD} = %v (%v), want 1", c, err)
	}
}

// Counting into a request-valued series that exists allocates nothing: no
// label is built as a string (the reference's stats of detailed_metric
// descriptors and of request overrides). They used to build the labels of
// such a request as strings: an allocation more per request.
func TestPerValueCountAllocatesNothing(t *testing.T) {
	cfg, err := config.Parse("ref.yaml", []byte(referenceConfig))
	if err != nil {
		t.Fatal(err)
	}
	st := NewStats(prometheus.NewRegistry(), StatsOptions{MaxValues: 2})
	rc := st.forConfig(cfg)
	perValue := desc("path", "/api/a").Entries
	l := cfg.Domain("d").Match(perValue).Limits[0]
	over := desc("o", "v").Entries
	overLimit := &config.Limit{Rule: engine.MustCompile(engine.Spec{Unit: engine.Hour, Multiplier: 1, Limit: 100}), Index: -1}
	it := engine.Item{Rule: l.Rule, Hits: 1}
	res := engine.Result{Admitted: true, Remaining: 10}
	var buf []byte
	count := func() {
		buf = st.record(rc, "d", perValue, l, &it, &res, buf)
		buf = st.record(rc, "d", over, overLimit, &it, &res, buf)
	}
	count() // makes the series and grows buf
	if n := testing.AllocsPerRun(100, count); n != 0 {
		t.Errorf("counting a detailed_metric descriptor and an override: %v allocations, want 0", n)
	}
}

// BenchmarkShouldRateLimitReferenceStats is the service's
// BenchmarkShouldRateLimit with the reference's per-limit stats, as compat
// mode counts them.
func BenchmarkShouldRateLimitReferenceStats(b *testing.B) {
	cfg, err := config.Parse("test.yaml", []byte(`
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
`))
	if err != nil {
		b.Fatal(err)
	}
	ms := memstore.New(memstore.Options{})
	defer ms.Close()
	reg := prometheus.NewRegistry()
	svc := service.New(service.Options{Store: ms, Observers: []service.Observer{decisionmetrics.New(reg, decisionmetrics.Options{}), NewStats(reg, StatsOptions{})}})
	svc.SetConfig(cfg)
	req := &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("remote_address", "10.0.0.1")}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
