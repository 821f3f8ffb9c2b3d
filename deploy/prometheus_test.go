package deploy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/proctest"
	"sigs.k8s.io/yaml"
)

const alertRuleTests = "prometheus/rls-alerts_test.yaml"

// alertWait bounds a wait for Prometheus to scrape, evaluate and fire: at a
// one-second scrape and evaluation interval and a for: of 2 s, a few seconds
// are enough; the rest is room for a busy machine.
const alertWait = 60 * time.Second

// shortFor is the for: the live test gives the alerts it drives, in place of
// the shipped one (1m and 5m), so that it can wait them out.
const shortFor = "2s"

// findPrometheus returns the prometheus binary (Debian's package
// prometheus, which make prereqs installs). Without one the test fails
// under CI=true and is skipped elsewhere.
func findPrometheus(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err == nil {
		return bin
	}
	const install = "prometheus not found: install it (apt-get install --no-install-recommends prometheus; make prereqs does this)"
	if os.Getenv("CI") == "true" {
		t.Fatal(install)
	}
	t.Skip(install)
	return ""
}

// alertNames returns the alerts of the shipped rule file, in file order.
func alertNames(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", alertRules, err)
	}
	var names []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s: no alerts", alertRules)
	}
	return names
}

// TestAlertRuleUnitTests: every alert of the rule file has exactly one case
// in the promtool unit tests (make deploy-check runs them with promtool test
// rules), named after it, whose evaluations are all of that alert, with at
// least one that expects it firing and one that expects nothing (the
// evaluation before for: runs out, or after the condition is gone).
func TestAlertRuleUnitTests(t *testing.T) {
	b, err := os.ReadFile(alertRuleTests)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		RuleFiles []string `json:"rule_files"`
		Tests     []struct {
			Name   string `json:"name"`
			Alerts []struct {
				EvalTime  string           `json:"eval_time"`
				AlertName string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", alertRuleTests, err)
	}
	if len(f.RuleFiles) != 1 || f.RuleFiles[0] != filepath.Base(alertRules) {
		t.Errorf("%s: rule_files %v, want [%s]", alertRuleTests, f.RuleFiles, filepath.Base(alertRules))
	}
	cases := map[string]int{}
	for i, tc := range f.Tests {
		cases[tc.Name]++
		firing, quiet := 0, 0
		for _, a := range tc.Alerts {
			if a.AlertName != tc.Name {
				t.Errorf("%s: case %d (%s): eval_time %s tests alert %s, not the case's", alertRuleTests, i, tc.Name, a.EvalTime, a.AlertName)
			}
			if len(a.ExpAlerts) == 0 {
				quiet++
			} else {
				firing++
			}
		}
		if firing == 0 || quiet == 0 {
			t.Errorf("%s: case %s: %d evaluations expect it firing and %d expect nothing, want at least one of each", alertRuleTests, tc.Name, firing, quiet)
		}
	}
	names := alertNames(t)
	known := map[string]bool{}
	for _, name := range names {
		known[name] = true
		if cases[name] != 1 {
			t.Errorf("%s: alert %s has %d cases, want 1", alertRuleTests, name, cases[name])
		}
	}
	for name := range cases {
		if !known[name] {
			t.Errorf("%s: case %s names no alert of %s", alertRuleTests, name, alertRules)
		}
	}
}

// rulesWithShortFor returns the shipped rule file with the for: of the
// named alerts replaced by d, and nothing else changed (the comments go:
// the file goes through JSON).
func rulesWithShortFor(t *testing.T, d string, alerts ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", alertRules, err)
	}
	unshortened := map[string]bool{}
	for _, a := range alerts {
		unshortened[a] = true
	}
	groups, _ := f["groups"].([]any)
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			if !unshortened[name] {
				continue
			}
			if _, ok := rule["for"]; !ok {
				t.Fatalf("%s: %s has no for: to shorten", alertRules, name)
			}
			rule["for"] = d
			delete(unshortened, name)
		}
	}
	if len(unshortened) > 0 {
		t.Fatalf("%s: no alerts %v", alertRules, unshortened)
	}
	out, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startPrometheus runs prometheus with config (a prometheus.yml) and the
// files beside it in a temporary directory, its TSDB there too, listening on
// a free loopback port, and waits until /-/ready answers 200. It returns the
// base URL.
func startPrometheus(t *testing.T, bin, config string, files map[string][]byte) (string, *proctest.Proc) {
	t.Helper()
	dir := t.TempDir()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	attempt := 0
	p, addr := proctest.StartListening(t, proctest.Options{Name: "prometheus"}, func(addr string) []string {
		attempt++
		return []string{bin,
			"--config.file=" + cfg,
			"--storage.tsdb.path=" + filepath.Join(dir, fmt.Sprintf("data%d", attempt)),
			"--web.listen-address=" + addr,
		}
	}, func(addr string) func() bool { return proctest.HTTPOK("http://" + addr + "/-/ready") })
	return "http://" + addr, p
}

// promAPI GETs path from Prometheus's HTTP API and decodes its data into v.
func promAPI(base, path string, v any) error {
	code, text, err := get(base + path)
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal([]byte(text), &r); err != nil {
		return fmt.Errorf("GET %s: %d %v: %.200s", path, code, err, text)
	}
	if r.Status != "success" {
		return fmt.Errorf("GET %s: %d %s: %s", path, code, r.Status, r.Error)
	}
	return json.Unmarshal(r.Data, v)
}

// promAlert is one alert of /api/v1/alerts.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	Value       string            `json:"value"`
}

func (a promAlert) String() string {
	return fmt.Sprintf("%s{instance=%q} %s", a.Labels["alertname"], a.Labels["instance"], a.State)
}

func promAlerts(base string) ([]promAlert, error) {
	var d struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := promAPI(base, "/api/v1/alerts", &d)
	return d.Alerts, err
}

// promRule is one rule of /api/v1/rules.
type promRule struct {
	Name           string    `json:"name"`
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

func promRules(base string) ([]promRule, error) {
	var d struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	err := promAPI(base, "/api/v1/rules", &d)
	var out []promRule
	for _, g := range d.Groups {
		out = append(out, g.Rules...)
	}
	return out, err
}

// evaluatedSince reports whether Prometheus has evaluated every rule of the
// shipped file after since, and every one without error (an error is
// fatal: a PromQL expression that fails at run time on real series).
func evaluatedSince(t *testing.T, base string, names []string, since time.Time) bool {
	t.Helper()
	rules, err := promRules(base)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rules {
		seen[r.Name] = true
		if r.Health == "err" || r.LastError != "" {
			t.Fatalf("Prometheus evaluated %s with an error: %s", r.Name, r.LastError)
		}
		if r.Health != "ok" || !r.LastEvaluation.After(since) {
			return false
		}
	}
	for _, name := range names {
		if !seen[name] {
			t.Fatalf("Prometheus loaded no rule %s (it has %v)", name, rules)
		}
	}
	return len(rules) == len(names)
}

// scraped reports whether the last scrape of every target succeeded and
// Prometheus has a rate of requests above 0 for each: the rules' rates
// have data.
func scraped(base string, targets ...string) bool {
	var d struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	q := url.QueryEscape(`sum by (instance) (rate(rls_requests_total{job="rls"}[5m])) > 0 and on (instance) up{job="rls"} == 1`)
	if err := promAPI(base, "/api/v1/query?query="+q, &d); err != nil {
		return false
	}
	have := map[string]bool{}
	for _, r := range d.Result {
		have[r.Metric["instance"]] = true
	}
	for _, target := range targets {
		if !have[target] {
			return false
		}
	}
	return true
}

// TestPrometheusFiresAlerts: the Debian package's Prometheus scrapes two
// running rls with the shipped rules (for: of the two alerts driven here
// shortened to shortFor, nothing else changed), at one-second scrape and
// evaluation intervals. Every rule evaluates without error on their series,
// and while both serve requests none fires and the two are not pending; then a
// reload of the memory-store rls fails and the Redis-store rls loses its
// Redis, and Prometheus's /api/v1/alerts has RLSConfigReloadFailed for the
// first and RLSStoreErrors for the second firing, and nothing else (a
// request refused a connection to Redis is not one of unknown outcome:
// RLSIndeterminateDecisions stays quiet).
func TestPrometheusFiresAlerts(t *testing.T) {
	bin := findPrometheus(t)
	names := alertNames(t)
	redisAddr, redis := proctest.StartRedis(t)

	limits, err := os.ReadFile("../config/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	memDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(memDir, "limits.yaml"), limits, 0o644); err != nil {
		t.Fatal(err)
	}
	memAddr := proctest.Addr(t)
	mem := proctest.StartRLS(t, memAddr, "serve", "--config="+memDir, "--http-addr="+memAddr, "--grpc-addr="+proctest.Addr(t), "--watch=false", "--store=memory")
	// A second for a store call: a slow round trip on a busy machine must
	// not be a store error before the test stops Redis.
	redAddr := proctest.Addr(t)
	proctest.StartRLS(t, redAddr, "serve", "--config=../config/limits.yaml", "--http-addr="+redAddr, "--grpc-addr="+proctest.Addr(t),
		"--store=redis", "--redis-url=redis://"+redisAddr+"/0", "--store-timeout=1s")

	rules := rulesWithShortFor(t, shortFor, "RLSConfigReloadFailed", "RLSStoreErrors")
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [rls-alerts.yaml]
scrape_configs:
  - job_name: rls
    static_configs:
      - targets: [%q, %q]
`, memAddr, redAddr)
	base, prom := startPrometheus(t, bin, config, map[string][]byte{"rls-alerts.yaml": rules})

	// Traffic while Prometheus waits: a request to each rls per poll, each
	// from one of 250 addresses in turn (10/s, 120/min per address: all
	// admitted at the pace of the polls), want (the status) or the test
	// fails.
	sent := 0
	traffic := func(wantMem, wantRed int) {
		for _, r := range []struct {
			addr string
			want int
		}{{memAddr, wantMem}, {redAddr, wantRed}} {
			sent++
			body := fmt.Sprintf(`{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"198.51.100.%d"}]}]}`, sent%250+1)
			if code, _, err := post("http://"+r.addr+"/json", body); err != nil || code != r.want {
				t.Fatalf("POST %s/json = %d %v, want %d", r.addr, code, err, r.want)
			}
		}
	}
	// Until the rules have been evaluated on rates of requests.
	var since time.Time
	err = prom.WaitWithin(alertWait, func() bool {
		traffic(http.StatusOK, http.StatusOK)
		if since.IsZero() && scraped(base, memAddr, redAddr) {
			since = time.Now()
		}
		return !since.IsZero() && evaluatedSince(t, base, names, since)
	})
	if err != nil {
		t.Fatalf("Prometheus did not scrape both rls and evaluate every rule: %v\n%s", err, prom.Output())
	}
	alerts, err := promAlerts(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		name := a.Labels["alertname"]
		if a.State == "firing" || name == "RLSConfigReloadFailed" || name == "RLSStoreErrors" {
			t.Errorf("while both rls serve: alert %v, want none firing (and these two not even pending)", a)
		}
	}

	// The faults.
	if err := os.WriteFile(filepath.Join(memDir, "bad.yaml"), []byte("domain: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := mem.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := redis.Stop(); err != nil {
		t.Fatalf("stopping redis-server: %v", err)
	}

	want := map[string]string{
		"RLSConfigReloadFailed": memAddr,
		"RLSStoreErrors":        redAddr,
	}
	err = prom.WaitWithin(alertWait, func() bool {
		// The memory store's rls serves its old limits; the other one
		// meets the store error (503 under --on-store-error=error).
		traffic(http.StatusOK, http.StatusServiceUnavailable)
		if alerts, err = promAlerts(base); err != nil {
			t.Fatal(err)
		}
		firing := 0
		for _, a := range alerts {
			if a.State == "firing" && want[a.Labels["alertname"]] == a.Labels["instance"] {
				firing++
			}
		}
		return firing == len(want)
	})
	if err != nil {
		t.Fatalf("alerts %v, want %v firing: %v\n%s", alerts, want, err, prom.Output())
	}
	var firing []string
	for _, a := range alerts {
		if a.State != "firing" {
			continue
		}
		firing = append(firing, a.String())
		name, instance := a.Labels["alertname"], a.Labels["instance"]
		if want[name] != instance {
			t.Errorf("alert %v, want only %v firing", a, want)
			continue
		}
		if a.Labels["job"] != "rls" || a.Labels["severity"] != "warning" {
			t.Errorf("alert %v: labels %v, want job=rls and severity=warning", a, a.Labels)
		}
		switch name {
		case "RLSConfigReloadFailed":
			if want := "rls " + instance + " is serving an old config: the last reload failed"; a.Annotations["summary"] != want {
				t.Errorf("%v: summary %q, want %q", a, a.Annotations["summary"], want)
			}
		case "RLSStoreErrors":
			// The ratio depends on how many requests the window holds.
			s := a.Annotations["summary"]
			if !strings.HasPrefix(s, "rls "+instance+": ") || !strings.HasSuffix(s, "% of requests meet a store error") {
				t.Errorf("%v: summary %q, want rls %s: N%% of requests meet a store error", a, s, instance)
			}
		}
	}
	sort.Strings(firing)
	t.Logf("firing: %v (after %d requests)", firing, sent)
	// Still every rule evaluates without error, Redis gone.
	if !evaluatedSince(t, base, names, time.Time{}) {
		t.Errorf("a rule of %s is no longer evaluated", alertRules)
	}
}
