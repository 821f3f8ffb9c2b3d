package compat

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rlsproject/rls/internal/config"
)

const refCorpus = "testdata/envoy-ratelimit"

// matchLimits returns the limits (as "rpu/unit") that entries reach in domain.
func matchLimits(t *testing.T, c *config.Config, domain string, kv ...string) string {
	t.Helper()
	var entries []config.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		entries = append(entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	n := c.Domain(domain).Match(entries)
	if n == nil {
		return "none"
	}
	var out []string
	for _, l := range n.Limits {
		if l.Unlimited {
			out = append(out, "unlimited")
			continue
		}
		out = append(out, fmt.Sprintf("%d/%s", l.Rule.Limit, l.Rule.Unit))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}

// The reference's own test configs load here, each meaning what it means
// there (the corpus' README says where each file comes from).
func TestReferenceCorpusLoads(t *testing.T) {
	c, err := config.Load(filepath.Join(refCorpus, "integration"))
	if err != nil {
		t.Fatalf("integration configs: %v", err)
	}
	if got := len(c.Domains()); got != 7 {
		t.Errorf("integration configs: %d domains, want 7", got)
	}
	for _, tc := range []struct {
		domain string
		kv     []string
		want   string
	}{
		{"basic", []string{"key1", "anything"}, "50/second"},
		{"basic", []string{"one_per_minute", "x"}, "1/minute"},
		{"another", []string{"key4", "x"}, "20/day"},
		{"share-threshold-test", []string{"files", "files/a.txt"}, "10/hour"},
		{"share-threshold-test", []string{"files", "other"}, "none"},
	} {
		if got := matchLimits(t, c, tc.domain, tc.kv...); got != tc.want {
			t.Errorf("integration %s %v: %s, want %s", tc.domain, tc.kv, got, tc.want)
		}
	}

	for _, tc := range []struct {
		file string
		kv   []string
		want string
	}{
		{"basic_config.yaml", []string{"key1", "value1", "subkey1", "x"}, "5/second"},
		{"basic_config.yaml", []string{"key1", "value1", "subkey1", "subvalue1"}, "10/second"},
		{"basic_config.yaml", []string{"key2", "value3"}, "none"}, // whitelisted
		{"basic_config.yaml", []string{"key2", "other"}, "20/minute"},
		{"basic_config.yaml", []string{"key5", "value5", "subkey5", "subvalue5"}, "25/day"},
		{"metadata.yaml", []string{"key2", "x"}, "20/minute"},
		{"wildcard.yaml", []string{"wild", "foo123"}, "20/minute"},
		{"wildcard.yaml", []string{"midWild", "barxb"}, "20/minute"},
		{"wildcard.yaml", []string{"midWild", "barxc"}, "none"},
		{"unit_multiplier.yaml", []string{"key1", "x"}, "20/minute"},
		{"share_threshold.yaml", []string{"file", "test1"}, "50/minute"},
		{"share_threshold.yaml", []string{"file", "test2"}, "100/minute"},
		{"share_threshold.yaml", []string{"user", "user/1", "resource", "res/2", "action", "get"}, "150/minute"},
	} {
		c, err := config.Load(filepath.Join(refCorpus, "unit", tc.file))
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if got := matchLimits(t, c, "test-domain", tc.kv...); got != tc.want {
			t.Errorf("%s %v: %s, want %s", tc.file, tc.kv, got, tc.want)
		}
	}
	c, err = config.Load(filepath.Join(refCorpus, "unit", "metadata.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domain("test-domain").Match([]config.Entry{{Key: "key2", Value: "x"}}).Metadata["service_with_quota"]; got == nil {
		t.Errorf("metadata.yaml: key2's metadata.service_with_quota is missing")
	}
}

// With MERGE_DOMAIN_CONFIG the reference merges a domain's descriptors
// from several files; without it the pair is a duplicate domain.
func TestReferenceMergeDomains(t *testing.T) {
	dir := filepath.Join(refCorpus, "merge")
	if _, err := config.Load(dir); err == nil || !strings.Contains(err.Error(), `duplicate domain "test-domain"`) {
		t.Fatalf("config.Load(merge pair) without merging: err = %v, want a duplicate domain", err)
	}
	c, err := config.LoadWith(config.LoadOptions{Parse: config.ParseOptions{MergeDomains: true}}, dir)
	if err != nil {
		t.Fatalf("config.LoadWith(MergeDomains): %v", err)
	}
	for _, tc := range []struct {
		kv   []string
		want string
	}{
		{[]string{"key1", "value1"}, "10/minute"},
		{[]string{"key2", "value2"}, "20/minute"},
	} {
		if got := matchLimits(t, c, "test-domain", tc.kv...); got != tc.want {
			t.Errorf("merged %v: %s, want %s", tc.kv, got, tc.want)
		}
	}
	if got := len(c.Limits()); got != 2 {
		t.Errorf("merged config has %d limits, want 2", got)
	}

	// A top-level descriptor in both files stays an error.
	dup := t.TempDir()
	writeFiles(t, dup, map[string]string{"a.yaml": domainDoc("d"), "b.yaml": domainDoc("d")})
	_, err = config.LoadWith(config.LoadOptions{Parse: config.ParseOptions{MergeDomains: true}}, dup)
	if err == nil || !strings.Contains(err.Error(), `b.yaml:3:5: duplicate descriptor "k" in domain "d"`) {
		t.Errorf("merging a repeated descriptor: err = %v", err)
	}
}

// The reference checks its keys without regard to their level: a key of
// its set where rls has no such key loads there, and loads here with a
// warning under ParseOptions; an unknown key is an error either way.
func TestReferenceKeysAtAnyLevel(t *testing.T) {
	text := "domain: d\nname: ignored\ndescriptors:\n  - key: k\n    unit: second\n    rate_limit: {unit: minute, requests_per_unit: 3, key: x}\n"
	if _, err := config.Parse("f.yaml", []byte(text)); err == nil {
		t.Fatalf("Parse without reference rules: no error")
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"f.yaml": text})
	c, err := config.LoadWith(config.LoadOptions{Parse: ParseOptions(false)}, dir)
	if err != nil {
		t.Fatalf("config.LoadWith(ParseOptions): %v", err)
	}
	if got := matchLimits(t, c, "d", "k", "v"); got != "3/minute" {
		t.Errorf("k: %s, want 3/minute", got)
	}
	var warns []string
	for _, w := range c.Warnings() {
		warns = append(warns, fmt.Sprintf("%s:%d:%d: %s", filepath.Base(w.File), w.Line, w.Column, w.Msg))
	}
	want := []string{
		`f.yaml:2:1: key "name" is ignored at the top of a document (envoyproxy/ratelimit ignores it there too)`,
		`f.yaml:5:5: descriptor "k": key "unit" is ignored in a descriptor (envoyproxy/ratelimit ignores it there too)`,
		`f.yaml:6:54: descriptor "k": key "key" is ignored in a rate_limit (envoyproxy/ratelimit ignores it there too)`,
	}
	if strings.Join(warns, "\n") != strings.Join(want, "\n") {
		t.Errorf("warnings:\n%s\nwant:\n%s", strings.Join(warns, "\n"), strings.Join(want, "\n"))
	}
	writeFiles(t, dir, map[string]string{"f.yaml": "domain: d\ndescriptors:\n  - key: k\n    colour: red\n"})
	if _, err := config.LoadWith(config.LoadOptions{Parse: ParseOptions(false)}, dir); err == nil || !strings.Contains(err.Error(), `unknown key "colour"`) {
		t.Errorf("unknown key under reference rules: err = %v", err)
	}
}

// An Envoy Gateway-shaped RateLimitConfig (domain per listener, one
// descriptor per route keyed and valued by the route's name, a chain per
// rule below it) converts to the config that the same YAML gives.
func TestFromXDSEnvoyGatewayShape(t *testing.T) {
	route := "httproute/default/backend/rule/0/match/0/www_example_com"
	rc := &rlsconfv3.RateLimitConfig{
		Name:   "default/eg/http",
		Domain: "default/eg/http",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: route, Value: route,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "rule-0-match-0", Value: "rule-0-match-0", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
					Key:       "rule-0-match-1",
					RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 3},
				}}},
				{Key: "rule-1-match-0", Value: "yes", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true, Name: "free"}, ShadowMode: true},
			},
		}},
	}
	c, err := FromXDS(config.ParseOptions{}, []*rlsconfv3.RateLimitConfig{rc})
	if err != nil {
		t.Fatalf("FromXDS: %v", err)
	}
	if got := matchLimits(t, c, "default/eg/http", route, route, "rule-0-match-0", "rule-0-match-0", "rule-0-match-1", "alice"); got != "3/hour" {
		t.Errorf("rule 0: %s, want 3/hour", got)
	}
	if got := matchLimits(t, c, "default/eg/http", route, route, "rule-1-match-0", "yes"); got != "unlimited" {
		t.Errorf("rule 1: %s, want unlimited", got)
	}
	if got := matchLimits(t, c, "default/eg/http", route, route); got != "none" {
		t.Errorf("route node: %s, want none", got)
	}
	if d := c.Domain("default/eg/http"); d == nil || d.File != `RateLimitConfig "default/eg/http"` {
		t.Errorf("domain's File = %v", d)
	}
}

// Values that YAML would read as something else stay text.
func TestFromXDSValuesStayText(t *testing.T) {
	rc := &rlsconfv3.RateLimitConfig{Name: "n", Domain: "yes", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "on", Value: "1e3", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 0}},
		{Key: "k", Value: "*x: {y}", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 7}},
	}}
	c, err := FromXDS(config.ParseOptions{}, []*rlsconfv3.RateLimitConfig{rc})
	if err != nil {
		t.Fatalf("FromXDS: %v", err)
	}
	if got := matchLimits(t, c, "yes", "on", "1e3"); got != "0/second" {
		t.Errorf("(on, 1e3): %s, want 0/second", got)
	}
	if got := matchLimits(t, c, "yes", "k", "abx: {y}"); got != "7/day" {
		t.Errorf("(k, abx: {y}): %s, want 7/day", got)
	}
}

// The loader's validation applies to xDS configs, and the problems name
// their resource.
func TestFromXDSInvalid(t *testing.T) {
	for _, tc := range []struct {
		name    string
		configs []*rlsconfv3.RateLimitConfig
		want    string
	}{
		{"no unit", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 1}}}}},
			`RateLimitConfig "a": descriptor "k": unit is required`},
		{"unknown unit number", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: 9, RequestsPerUnit: 1}}}}},
			`RateLimitConfig "a": descriptor "k": unit "9" is not one of`},
		{"unlimited with a unit", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, Unlimited: true}}}}},
			"should not specify rate limit unit when unlimited"},
		{"empty key", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Value: "v"}}}},
			"descriptor has empty key"},
		{"empty domain", []*rlsconfv3.RateLimitConfig{{Name: "a"}}, `RateLimitConfig "a": domain is empty`},
		{"duplicate descriptor", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k"}, {Key: "k"}}}},
			`duplicate descriptor "k"`},
		{"duplicate domain", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "b", Domain: "d"}},
			`RateLimitConfig "b": duplicate domain "d"`},
		{"self replace", []*rlsconfv3.RateLimitConfig{{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, Name: "x", Replaces: []*rlsconfv3.RateLimitReplace{{Name: "x"}}}}}}},
			"replaces names this limit itself"},
	} {
		_, err := FromXDS(config.ParseOptions{}, tc.configs)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
	// Two resources of one domain merge under MergeDomains.
	c, err := FromXDS(config.ParseOptions{MergeDomains: true}, []*rlsconfv3.RateLimitConfig{
		{Name: "a", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "a", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}}}},
		{Name: "b", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "b", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 2}}}},
	})
	if err != nil {
		t.Fatalf("FromXDS(MergeDomains): %v", err)
	}
	if got := matchLimits(t, c, "d", "b", "x"); got != "2/minute" {
		t.Errorf("merged (b, x): %s, want 2/minute", got)
	}
}
