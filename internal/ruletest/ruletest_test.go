package ruletest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/strictyaml"
)

const limitsYAML = `
domain: api
http_descriptors:
  - actions: [{remote_address: {}}]
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: minute, requests_per_unit: 3, name: per_minute}
  - key: key
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 5}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 100, name: gold, replaces: [{name: per_minute}]}
`

func loadConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse("limits.yaml", []byte(limitsYAML))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// run parses the test file text and runs it against limitsYAML.
func run(t *testing.T, text string) (string, int, int) {
	t.Helper()
	f, err := Parse("t.yaml", []byte(text))
	if err != nil {
		t.Fatalf("Parse:\n%s\n%v", text, err)
	}
	var out bytes.Buffer
	passed, failed := Run(loadConfig(t), f, &out)
	return out.String(), passed, failed
}

// TestPassingTimeline: a timeline that holds passes, with each kind of step
// timing, repeats, statuses, headers, overrides, replaces and the HTTP form.
func TestPassingTimeline(t *testing.T) {
	out, passed, failed := run(t, `
domain: api
start: 2030-01-01T00:00:00Z
tests:
  - name: two a second, three a minute
    steps:
      - descriptors: [remote_address=10.0.0.1]
        repeat: 2
        expect: OK
        statuses: [{code: OK, limit: remote_address/1s, remaining: 0, reset: 1s}]
      - descriptors: [remote_address=10.0.0.1]
        expect: OVER_LIMIT
        headers: {Retry-After: "1", X-RateLimit-Remaining: "0"}
      - after: 1s
        descriptors: [remote_address=10.0.0.1]
        expect: OK
        statuses: [{limit: per_minute, remaining: 0, reset: 59s}]
      - at: 2s
        descriptors: [remote_address=10.0.0.1]
        expect: OVER_LIMIT
        statuses: [{code: OVER_LIMIT, limit: per_minute, reset: 58s}]
        headers: {Retry-After: "58"}
      - instant: 2030-01-01T00:01:00Z
        http: {client: 10.0.0.1}
        expect: OK
  - name: replaces and overrides
    steps:
      - descriptors: [remote_address=10.0.0.2, plan=gold]
        repeat: 2
        every: 1s
        expect: OK
        statuses: [{limit: remote_address/1s, remaining: 1}, {limit: gold, remaining: 98}]
      - descriptors:
          - {entries: [{key: remote_address, value: "10.0.0.3"}], limit: {requests_per_unit: 1, unit: hour}}
        expect: OK
        statuses: [{limit: override, remaining: 0, reset: 3599s}]
      - descriptors: [[{key: remote_address, value: "10.0.0.3"}]]
        expect: OK
        statuses: [{limit: remote_address/1s, remaining: 1}]
  - name: more than the bucket holds never passes
    steps:
      - descriptors: [{entries: key=k, hits: 0x6}]
        expect: OVER_LIMIT
        headers: {Retry-After: null}
      - descriptors: [{entries: key=k, hits: 0_5}]
        expect: OK
      - descriptors: [{entries: key=k, hits: 5, refund: true}]
        expect: OK
        statuses: [{remaining: 5}]
`)
	want := "PASS two a second, three a minute\nPASS replaces and overrides\nPASS more than the bucket holds never passes\n"
	if out != want || passed != 3 || failed != 0 {
		t.Errorf("Run = %d passed, %d failed:\n%s\nwant 3 passed:\n%s", passed, failed, out, want)
	}
}

// TestFailures: the first expectation that does not hold fails its case
// with "FAIL name: step N: got …, want …"; the other cases still run.
func TestFailures(t *testing.T) {
	for _, tc := range []struct {
		name, steps, want string
	}{
		{"verdict", `
      - descriptors: [remote_address=10.0.0.1]
        repeat: 3
        expect: OK`,
			"step 1: got OVER_LIMIT, want OK; statuses[0]: OVER_LIMIT remote_address/1s remaining 0 reset 1s (request 3 of 3, at +0s)"},
		{"remaining", `
      - descriptors: [remote_address=10.0.0.1]
        expect: OK
      - at: 500ms
        descriptors: [remote_address=10.0.0.1]
        expect: OK
        statuses: [{remaining: 1}]`,
			"step 2: got statuses[0] remaining 0, want 1 (at +500ms)"},
		{"reset", `
      - descriptors: [remote_address=10.0.0.1]
        expect: OK
        statuses: [{reset: 60s}]`,
			"step 1: got statuses[0] reset 1s, want 1m0s (at +0s)"},
		{"limit", `
      - descriptors: [remote_address=10.0.0.1]
        expect: OK
        statuses: [{limit: null}]`,
			`step 1: got statuses[0] limit "remote_address/1s", want none (at +0s)`},
		{"code", `
      - descriptors: [remote_address=10.0.0.1, key=k]
        expect: OK
        statuses: [{code: OK}, {code: OVER_LIMIT}]`,
			"step 1: got statuses[1] OK, want OVER_LIMIT (at +0s)"},
		{"header", `
      - descriptors: [{entries: key=k, hits: 9}]
        expect: OVER_LIMIT
        headers: {Retry-After: "1"}`,
			`step 1: got no header Retry-After, want "1" (at +0s)`},
		{"header absent", `
      - descriptors: [remote_address=10.0.0.1]
        expect: OK
        headers: {RateLimit: null}`,
			`step 1: got header RateLimit "\"remote_address/1s\";r=1;t=1", want none (at +0s)`},
		{"statuses", `
      - http: {}
        expect: OK
        statuses: [{code: OK}]`,
			"step 1: got 0 statuses, want 1 or more (at +0s)"},
		{"domain", `
      - domain: apx
        descriptors: [remote_address=10.0.0.1]
        expect: OK`,
			`step 1: got domain "apx", want a domain of the config (api)`},
		{"invalid request", `
      - descriptors: [{entries: a=b, limit: {requests_per_unit: 1, unit: year, unit_multiplier: 101}}]
        expect: OK`,
			`step 1: got error "descriptors[0].limit.unit_multiplier: 101 years is longer than 100 years", want OK (at +0s)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := "domain: api\ntests:\n  - name: fails\n    steps:" + tc.steps + "\n  - name: passes\n    steps: [{descriptors: [a=b], expect: OK}]\n"
			out, passed, failed := run(t, text)
			want := "FAIL fails: " + tc.want + "\nPASS passes\n"
			if out != want || passed != 1 || failed != 1 {
				t.Errorf("Run printed\n%s\nwant\n%s", out, want)
			}
		})
	}
}

// TestOverridesSection: a file's overrides apply to every case from its
// start, a case's from its own instant (at), until their ttl; a prefix
// covers its values; an override that matches no limit fails its case,
// saying where.
func TestOverridesSection(t *testing.T) {
	out, passed, failed := run(t, `
domain: api
overrides:
  - {descriptor: "remote_address=10.9.*", requests_per_unit: 0, reason: blocked range}
tests:
  - name: a tier upgrade mid-window
    overrides:
      - {descriptor: remote_address=10.0.0.1, name: per_minute, requests_per_unit: 10, at: 30s}
    steps:
      - {at: 1s, descriptors: [remote_address=10.0.0.1], expect: OK}
      - {at: 2s, descriptors: [remote_address=10.0.0.1], expect: OK}
      - {at: 3s, descriptors: [remote_address=10.0.0.1], expect: OK, statuses: [{limit: per_minute, remaining: 0}]}
      - {at: 4s, descriptors: [remote_address=10.0.0.1], expect: OVER_LIMIT}
      - {at: 30s, descriptors: [remote_address=10.0.0.1], hits: 2, expect: OK}
      - {at: 31s, descriptors: [remote_address=10.0.0.1], hits: 2, expect: OK}
      - {at: 32s, descriptors: [remote_address=10.0.0.1], hits: 2, expect: OK}
      - {at: 33s, descriptors: [remote_address=10.0.0.1], hits: 2, expect: OVER_LIMIT, statuses: [{code: OVER_LIMIT, limit: per_minute, remaining: 1}]}
  - name: a temporary raise ends by itself
    overrides:
      - {descriptor: key=k1, requests_per_unit: 50, burst: 100, ttl: 10s}
    steps:
      - {descriptors: [key=k1], hits: 100, expect: OK}
      - {at: 11s, descriptors: [key=k1], hits: 6, expect: OVER_LIMIT, headers: {Retry-After: null}}
  - name: the file's prefix blocks
    steps:
      - {descriptors: [remote_address=10.9.0.7], expect: OVER_LIMIT}
      - {descriptors: [remote_address=10.8.0.7], expect: OK}
  - name: an override of no limit
    overrides:
      - {descriptor: nothing=here, requests_per_unit: 5}
    steps:
      - {descriptors: [remote_address=10.0.0.1], expect: OK}
`)
	if passed != 3 || failed != 1 {
		t.Errorf("passed %d, failed %d; want 3 and 1:\n%s", passed, failed, out)
	}
	if want := "FAIL an override of no limit: the override at line 30:10: the override matches no limit of the loaded config: descriptor nothing=here reaches no node of domain \"api\"\n"; !strings.Contains(out, want) {
		t.Errorf("got\n%s\nwant a line %q", out, want)
	}
}

// TestCasesDoNotShareCounters: each case starts from empty counters.
func TestCasesDoNotShareCounters(t *testing.T) {
	step := "    steps: [{descriptors: [remote_address=10.0.0.1], repeat: 2, expect: OK}]\n"
	out, passed, _ := run(t, "domain: api\ntests:\n  - name: one\n"+step+"  - name: two\n"+step)
	if passed != 2 {
		t.Errorf("two cases of the same two hits:\n%s\nwant both to pass", out)
	}
}

// TestBadFiles: every file of testdata/bad is refused with exactly the
// problems listed, as file:line:col: message.
func TestBadFiles(t *testing.T) {
	want := map[string][]string{
		"alias.yaml": {
			`2:1: unknown key "step" in the test file (allowed: domain, start, overrides, tests)`,
			"6:52: aliases are not supported in test files",
		},
		"bad_client.yaml":           {`5:24: http.client: "10.0.0.300" is not an IP address`},
		"bad_code.yaml":             {`6:17: expect: "DENIED" is not OK or OVER_LIMIT`},
		"bad_duration.yaml":         {`5:13: at must be a duration (e.g. 1.5s, 2m, 1h30m), got number 10`},
		"bad_entries.yaml":          {`5:23: descriptors[0]: "remote_address": entries are key=value, separated by commas (a value with a comma needs the entries: [{key: K, value: V}] form)`},
		"bad_start.yaml":            {`4:12: start: "2030-01-01" is not an RFC 3339 instant (e.g. 2030-01-01T00:00:00Z)`},
		"descriptors_and_http.yaml": {"6:16: a step has descriptors or http, not both"},
		"duplicate_name.yaml":       {`5:5: duplicate test name "same" (first at line 3)`},
		"empty.yaml":                {"1:1: empty test file (want tests:)"},
		"hits_negative.yaml":        {"5:46: descriptors[0].hits must not be negative, got -1"},
		"hits_on_http.yaml":         {"6:15: hits: an http step counts 1 hit per descriptor"},
		"no_domain.yaml":            {"4:9: a step needs a domain (on the step, its test or the file)"},
		"no_expect.yaml":            {"5:9: a step needs expect: OK or expect: OVER_LIMIT"},
		"no_tests.yaml":             {"1:1: no tests: (want a list of cases)"},
		"override_unit.yaml":        {`6:64: descriptors[0].limit.unit: "fortnight" is not one of second|minute|hour|day|week|month|year`},
		"override_no_rpu.yaml":      {"3:5: overrides[0] needs requests_per_unit (0 blocks every request)"},
		"repeat_too_big.yaml":       {"6:17: repeat: 1000001 is not from 1 to 1000000"},
		"repeat_zero.yaml":          {"6:17: repeat: 0 is not from 1 to 1000000"},
		"reset_not_seconds.yaml":    {"7:28: statuses[0].reset: 500ms is not whole seconds (duration_until_reset is sent in whole seconds, rounded up)"},
		"syntax.yaml":               {"3:1: invalid YAML: did not find expected ',' or ']'"},
		"too_many_statuses.yaml":    {"7:19: statuses: 2 for 1 descriptors"},
		"two_times.yaml":            {"6:16: a step has one of at, after and instant"},
		"unknown_anchor.yaml":       {"6:22: invalid YAML: unknown anchor 'd' referenced"},
		"unknown_key.yaml": {
			"5:9: a step needs expect: OK or expect: OVER_LIMIT",
			`6:9: unknown key "expct" in a step (did you mean "expect"?)`,
		},
		"override_keys.yaml": {
			`3:65: unknown key "at" in overrides[0] (did you mean "ttl"?)`,
			`7:22: overrides[0].descriptor: "remote_address": entries are key=value, separated by commas (a value with a comma needs the entries: [{key: K, value: V}] form)`,
			`7:67: overrides[0].ttl must be a duration (e.g. 1.5s, 2m, 1h30m), got string "2x"`,
			`7:71: unknown key "rpu" in overrides[0] (allowed: domain, descriptor, name, requests_per_unit, burst, ttl, reason, at)`,
		},
	}
	files, _ := filepath.Glob("testdata/bad/*.yaml")
	if len(files) != len(want) {
		t.Errorf("%d files in testdata/bad, %d in the table", len(files), len(want))
	}
	for _, path := range files {
		name := filepath.Base(path)
		_, err := LoadFile(path)
		var list strictyaml.ErrorList
		if !errors.As(err, &list) {
			t.Errorf("%s: LoadFile = %v, want problems", name, err)
			continue
		}
		var got []string
		for _, e := range list {
			got = append(got, strings.TrimPrefix(e.Error(), path+":"))
		}
		if strings.Join(got, "\n") != strings.Join(want[name], "\n") {
			t.Errorf("%s:\ngot\n%s\nwant\n%s", name, strings.Join(got, "\n"), strings.Join(want[name], "\n"))
		}
	}
}

func TestLoadFileTooBig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, bytes.Repeat([]byte("#\n"), MaxFileBytes/2+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("LoadFile(%d bytes) = %v, want a refusal", MaxFileBytes+2, err)
	}
}

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/bad/*.yaml")
	files = append(files, "../../config/limits_test.yaml")
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	cfg, err := config.Parse("limits.yaml", []byte(limitsYAML))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("f.yaml", data)
		if err != nil {
			return
		}
		for _, c := range file.Cases {
			total := 0
			for _, s := range c.Steps {
				total += s.Repeat
			}
			if total <= 1000 { // bounded work per input
				RunCase(cfg, c)
			}
		}
	})
}

// TestCalendarHeadersOnTheCaseClock: a case's headers advertise the
// calendar window of the case's instant, not of the wall clock's (the
// service reads the case's clock too).
func TestCalendarHeadersOnTheCaseClock(t *testing.T) {
	f, err := Parse("t.yaml", []byte(`
domain: cal
start: 2024-02-10T12:00:00Z
tests:
  - name: February has 29 days in 2024
    steps:
      - descriptors: [user=alice]
        expect: OK
        headers: {RateLimit-Policy: '"user/1mo";q=10;w=2505600'}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("cal.yaml", []byte("domain: cal\ndescriptors:\n  - key: user\n    rate_limit: {unit: month, requests_per_unit: 10, calendar: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if passed, _ := Run(cfg, f, &out); passed != 1 {
		t.Errorf("Run:\n%s\nwant the case to pass", out.String())
	}
}

// TestProblemsReportedAsConfigDoes: a test file and a config file read
// with one reader, so that the same mistake is reported in the same words
// (before, test files listed known keys instead of proposing the nearest,
// named duplicates without the first one's place, called a list key
// `unknown key ""`, refused merge keys, and spelled booleans and numbers
// their own way).
func TestProblemsReportedAsConfigDoes(t *testing.T) {
	step := "domain: api\ntests:\n  - name: t\n    steps:\n      - "
	limit := "domain: api\ndescriptors:\n  - key: k\n    rate_limit: "
	for _, tc := range []struct {
		name, test, config   string
		wantTest, wantConfig string // how the messages end
	}{
		{"unknown key", step + "{descriptors: [a=b], expct: OK}\n", limit + "{unit: second, requests_per_units: 1}\n",
			`unknown key "expct" in a step (did you mean "expect"?)`, `unknown key "requests_per_units" in rate_limit (did you mean "requests_per_unit"?)`},
		{"duplicate key", step + "{descriptors: [a=b], expect: OK, expect: OK}\n", limit + "{unit: second, unit: second}\n",
			`duplicate key "expect" (first at 5:30)`, `duplicate key "unit" (first at 4:18)`},
		{"boolean", step + "{descriptors: [{entries: a=b, refund: 1}], expect: OK}\n", limit + "{unit: second, shadow_mode: 1}\n",
			"refund must be true or false, got number 1", "shadow_mode must be true or false, got number 1"},
		{"number", step + "{descriptors: [{entries: a=b, hits: 1.5}], expect: OK}\n", limit + "{unit: second, requests_per_unit: 1.5}\n",
			"hits must be a whole number, got number 1.5", "requests_per_unit must be a whole number, got number 1.5"},
		{"key not a string", step + "{[a]: 1, descriptors: [a=b], expect: OK}\n", limit + "{[a]: 1, unit: second}\n",
			"a mapping key must be a string, got a list", "a mapping key must be a string, got a list"},
	} {
		_, testErr := Parse("t.yaml", []byte(tc.test))
		_, configErr := config.Parse("c.yaml", []byte(tc.config))
		if testErr == nil || !strings.HasSuffix(testErr.Error(), tc.wantTest) {
			t.Errorf("%s: test file: %v, want a problem ending %q", tc.name, testErr, tc.wantTest)
		}
		if configErr == nil || !strings.HasSuffix(configErr.Error(), tc.wantConfig) {
			t.Errorf("%s: config file: %v, want a problem ending %q", tc.name, configErr, tc.wantConfig)
		}
	}
	// Merge keys work in both.
	if _, err := Parse("t.yaml", []byte(step+"{<<: {expect: OK}, descriptors: [a=b]}\n")); err != nil {
		t.Errorf("a step with a merge key: %v", err)
	}
}
