package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLimitsExampleTests: the shipped tests pass against their configs, as
// `rls test` runs them (and `make test`, through this test):
// config/limits_test.yaml, config/examples/calendar_test.yaml (month
// ends, a leap day, a DST change, an ISO week), penalty_test.yaml (the
// ladder of blocks, and its reset), concurrency_test.yaml (requests in
// flight), overrides_test.yaml (runtime overrides) and llm_test.yaml
// (reservations of LLM token budgets).
func TestLimitsExampleTests(t *testing.T) {
	for _, pair := range [][2]string{
		{"../../config/limits.yaml", "../../config/limits_test.yaml"},
		{"../../config/examples/calendar.yaml", "../../config/examples/calendar_test.yaml"},
		{"../../config/examples/penalty.yaml", "../../config/examples/penalty_test.yaml"},
		{"../../config/examples/concurrency.yaml", "../../config/examples/concurrency_test.yaml"},
		{"../../config/examples/overrides.yaml", "../../config/examples/overrides_test.yaml"},
		{"../../config/examples/llm.yaml", "../../config/examples/llm_test.yaml"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), []string{"test", pair[0], pair[1]}, nil, &out, io.Discard)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if err != nil || len(lines) < 2 || !strings.HasSuffix(lines[len(lines)-1], " passed, 0 failed") {
			t.Fatalf("rls test %s %s = %v:\n%s", pair[0], pair[1], err, out.String())
		}
		for _, l := range lines[:len(lines)-1] {
			if !strings.HasPrefix(l, "PASS ") {
				t.Errorf("%s: line %q, want PASS name", pair[1], l)
			}
		}
	}
}

// TestTestCommand: a failing case, a bad test file and a bad config exit
// 1 with what went wrong; a bad command line exits 2.
func TestTestCommand(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	config := write("limits.yaml", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	tests := write("t.yaml", `domain: api
tests:
  - name: one a second
    steps:
      - {descriptors: [k=v], expect: OK}
      - {descriptors: [k=v], expect: OVER_LIMIT}
  - name: wrongly hopes for two
    steps:
      - {descriptors: [k=v], repeat: 2, expect: OK}
`)
	bad := write("bad.yaml", "domain: api\ntests:\n  - name: x\n    stps: []\n")
	badConfig := write("bad_limits.yaml", "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{config, tests}, 1, "PASS one a second\n" +
			"FAIL wrongly hopes for two: step 1: got OVER_LIMIT, want OK; statuses[0]: OVER_LIMIT k/1s remaining 0 reset 1s (request 2 of 2, at +0s)\n" +
			"1 passed, 1 failed\n"},
		{[]string{config, bad, tests}, 1, bad + ":3:5: test \"x\" has no steps\n" +
			bad + `:4:5: unknown key "stps" in a test (did you mean "steps"?)` + "\n" +
			"PASS one a second\n"},
		{[]string{badConfig, tests}, 1, badConfig + `:4:24: descriptor "k": unit "fortnight" is not one of second|minute|hour|day|week|month|year` + "\n"},
		{[]string{config}, 2, ""},
	} {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"test"}, tc.args...), nil, &out, io.Discard)
		if exitCode(err) != tc.code || !strings.HasPrefix(out.String(), tc.out) {
			t.Errorf("rls test %v: exit %d, printed\n%s\nwant exit %d and\n%s", tc.args, exitCode(err), out.String(), tc.code, tc.out)
		}
	}
}
