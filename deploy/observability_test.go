package deploy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/rlsproject/rls/internal/proctest"
)

const (
	alertRules = "prometheus/rls-alerts.yaml"
	dashboard  = "grafana/rls-dashboard.json"
)

// targetLabels are added by Prometheus to every scraped series; up is
// Prometheus's own series for every target.
var (
	targetLabels = map[string]bool{"job": true, "instance": true}
	promOwn      = map[string]bool{"up": true}
)

// exported is what rls's /metrics holds: series name -> label -> values.
type exported map[string]map[string]map[string]bool

func (e exported) add(name string, lps []*dto.LabelPair, extra ...string) {
	if e[name] == nil {
		e[name] = map[string]map[string]bool{}
	}
	for _, lp := range lps {
		if e[name][lp.GetName()] == nil {
			e[name][lp.GetName()] = map[string]bool{}
		}
		e[name][lp.GetName()][lp.GetValue()] = true
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if e[name][extra[i]] == nil {
			e[name][extra[i]] = map[string]bool{}
		}
		e[name][extra[i]][extra[i+1]] = true
	}
}

// parseMetrics reads the text format as Prometheus scrapes it, histograms
// and summaries as the series a query names (_bucket with le, _sum, _count).
func parseMetrics(t *testing.T, r io.Reader, into exported) {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				into.add(name+"_bucket", m.GetLabel(), "le", "+Inf")
				into.add(name+"_sum", m.GetLabel())
				into.add(name+"_count", m.GetLabel())
			case dto.MetricType_SUMMARY:
				into.add(name, m.GetLabel(), "quantile", "0.5")
				into.add(name+"_sum", m.GetLabel())
				into.add(name+"_count", m.GetLabel())
			default:
				into.add(name, m.GetLabel())
			}
		}
	}
}

// scrapeOnce caches the series of both stores for the tests of this file.
var scrapeOnce struct {
	sync.Mutex
	done bool
	e    exported
}

// rlsSeries starts rls on the memory store and on a real Redis, sends
// requests that are admitted, denied and denied again (the Redis denial
// cache), breaks a reload, and returns every series the two /metrics hold.
// shadowConfig has a shadow-mode limit that every request is over.
const shadowConfig = `domain: shadow-check
descriptors:
  - key: plan
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
`

func rlsSeries(t *testing.T) exported {
	t.Helper()
	scrapeOnce.Lock()
	defer scrapeOnce.Unlock()
	if scrapeOnce.done {
		return scrapeOnce.e
	}
	e := exported{}
	redisAddr, _ := proctest.StartRedis(t)
	// Redis has a second to decide each request, not the default 10 ms: the
	// request over a shadow-mode limit below must be decided (a 503 from a
	// missed store timeout fails the test), and on a busy machine a sound
	// round trip can miss 10 ms. No series depends on the timeout.
	for _, store := range [][]string{{"--store=memory"}, {"--store=redis", "--redis-url=redis://" + redisAddr + "/0", "--store-timeout=1s"}} {
		dir := t.TempDir()
		limits, err := os.ReadFile("../config/limits.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), limits, 0o644); err != nil {
			t.Fatal(err)
		}
		// A shadow-mode limit, whose series exist once one would deny.
		if err := os.WriteFile(filepath.Join(dir, "shadow.yaml"), []byte(shadowConfig), 0o644); err != nil {
			t.Fatal(err)
		}
		httpAddr := proctest.Addr(t)
		args := append([]string{"serve", "--config=" + dir, "--http-addr=" + httpAddr, "--grpc-addr=" + proctest.Addr(t), "--watch=false"}, store...)
		p := proctest.StartRLS(t, httpAddr, args...)
		base := "http://" + httpAddr
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"203.0.113.9"}]},{"entries":[{"key":"tenant","value":"t1"}]}]}`
		// Until three denials (a denial, then the cached ones). The limits
		// are 10/s, 120/min and 240/h per address: 13 requests may straddle
		// a second and all pass, but 250 cannot all pass within an hour.
		codes := map[int]int{}
		for sent := 0; sent < 250 && codes[http.StatusTooManyRequests] < 3; sent++ {
			resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[resp.StatusCode]++
		}
		if codes[http.StatusTooManyRequests] < 3 {
			t.Fatalf("%v: requests got %v, want 429s (10/s, 120/min, 240/h per address)", store, codes)
		}
		if code, text, err := post(base+"/json", `{"domain":"shadow-check","descriptors":[{"entries":[{"key":"plan","value":"free"}]}]}`); err != nil || code != http.StatusOK {
			t.Fatalf("%v: a request over a shadow-mode limit = %d %v %s, want 200", store, code, err, text)
		}
		// A reload that fails, so that its series exist as after a bad edit.
		if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("domain: [\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := p.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		var text string
		err = p.WaitFor(func() bool {
			_, text, err = get(base + "/metrics")
			return err == nil && strings.Contains(text, "\nrls_config_last_reload_successful 0\n")
		})
		if err != nil {
			t.Fatalf("%v: no failed reload in /metrics after SIGHUP with a bad file: %v\n%s", store, err, text)
		}
		// The requests spent a limit of remote_address to the last hit:
		// its fullness series exist on both stores (their values depend
		// on whether its window has reset since).
		for _, above := range []string{"0.5", "0.8", "1"} {
			if !strings.Contains(text, `rls_limit_keys_fullness{above="`+above+`",domain="api",limit="remote_address/`) {
				t.Errorf("%v: no rls_limit_keys_fullness{above=%q,domain=\"api\",limit=\"remote_address/…\"} in /metrics after denials:\n%s", store, above, text)
			}
		}
		parseMetrics(t, strings.NewReader(text), e)
		if err := p.Stop(); err != nil {
			t.Errorf("rls %v: %v", store, err)
		}
	}
	scrapeOnce.done, scrapeOnce.e = true, e
	return e
}

// query is one PromQL expression and where it comes from.
type query struct{ where, expr string }

var grafanaVar = regexp.MustCompile(`\$(\{[A-Za-z_]+\}|[A-Za-z_]+)`)

// dashboardQueries returns the dashboard's panel and variable queries, with
// Grafana's variables replaced as Grafana would (intervals by 5m; $job and
// $domain appear in regex matchers only, as .*).
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string           `json:"title"`
		UID    string           `json:"uid"`
		Panels []map[string]any `json:"panels"`
		Templ  struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("%s: no title or uid", dashboard)
	}
	subst := func(s string) string {
		s = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h").Replace(s)
		return grafanaVar.ReplaceAllString(s, ".*")
	}
	var out []query
	ids := map[float64]bool{}
	var walk func([]map[string]any)
	walk = func(ps []map[string]any) {
		for _, p := range ps {
			id, _ := p["id"].(float64)
			title, _ := p["title"].(string)
			if ids[id] {
				t.Errorf("%s: panel id %v used twice", dashboard, id)
			}
			ids[id] = true
			if p["type"] != "row" && len(p["targets"].([]any)) == 0 {
				t.Errorf("%s: panel %q has no query", dashboard, title)
			}
			if ts, ok := p["targets"].([]any); ok {
				for _, tg := range ts {
					expr, _ := tg.(map[string]any)["expr"].(string)
					out = append(out, query{fmt.Sprintf("%s: panel %q", dashboard, title), subst(expr)})
				}
			}
			if sub, ok := p["panels"].([]any); ok {
				var nested []map[string]any
				for _, s := range sub {
					nested = append(nested, s.(map[string]any))
				}
				walk(nested)
			}
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)
	for _, v := range d.Templ.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("%s: variable %s: %q is not label_values(selector, label)", dashboard, v.Name, v.Definition)
			continue
		}
		// label_values(sel, l) lists l's values: l must be on sel's series.
		out = append(out, query{fmt.Sprintf("%s: variable %s", dashboard, v.Name), fmt.Sprintf("count by (%s) (%s)", m[2], subst(m[1]))})
	}
	if len(out) < 20 {
		t.Errorf("%s: only %d queries found", dashboard, len(out))
	}
	return out
}

// ruleQueries parses the rule file as Prometheus does (unknown fields,
// PromQL and templates are errors) and returns its expressions.
func ruleQueries(t *testing.T) []query {
	t.Helper()
	groups, errs := rulefmt.ParseFile(alertRules, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	var out []query
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			where := fmt.Sprintf("%s: %s", alertRules, r.Alert)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: want a severity label and a summary annotation", where)
			}
			out = append(out, query{where, r.Expr})
		}
	}
	return out
}

// checkQuery parses q and returns a problem per selector or grouping that
// does not match what rls exports.
func checkQuery(q query, e exported) []string {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q.expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v\n  %s", q.where, err, q.expr)}
	}
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, q.where+": "+fmt.Sprintf(format, args...))
	}
	selectors := 0
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			selectors++
			name := n.Name
			if promOwn[name] {
				return nil
			}
			series, ok := e[name]
			if !ok {
				bad("%s is not a metric rls exports", name)
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name == labels.MetricName || targetLabels[m.Name] {
					continue
				}
				values, ok := series[m.Name]
				if !ok {
					bad("%s has no label %q", name, m.Name)
					continue
				}
				for _, v := range literalValues(m) {
					if !values[v] {
						bad("%s{%s=%q}: rls exports no such value (it has %v)", name, m.Name, v, keys(values))
					}
				}
			}
		case *parser.AggregateExpr:
			have := map[string]bool{"le": true}
			parser.Inspect(n.Expr, func(inner parser.Node, _ []parser.Node) error {
				if vs, ok := inner.(*parser.VectorSelector); ok {
					for l := range e[vs.Name] {
						have[l] = true
					}
				}
				return nil
			})
			for _, l := range n.Grouping {
				if !have[l] && !targetLabels[l] {
					bad("by (%s): not a label of the series it aggregates", l)
				}
			}
		}
		return nil
	})
	if selectors == 0 {
		bad("no metric queried")
	}
	return problems
}

// literalValues are the values an = matcher, or a =~ matcher made of plain
// alternatives (ok|over_limit), names.
func literalValues(m *labels.Matcher) []string {
	switch m.Type {
	case labels.MatchEqual:
		return []string{m.Value}
	case labels.MatchRegexp:
		if regexp.QuoteMeta(strings.ReplaceAll(m.Value, "|", "")) == strings.ReplaceAll(m.Value, "|", "") {
			return strings.Split(m.Value, "|")
		}
	}
	return nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestAlertRules: the rules parse as Prometheus parses them, and query only
// what rls exports, with labels and values it has.
func TestAlertRules(t *testing.T) {
	qs := ruleQueries(t)
	e := rlsSeries(t)
	for _, q := range qs {
		for _, p := range checkQuery(q, e) {
			t.Error(p)
		}
	}
	want := map[string]bool{"RLSConfigReloadFailed": false, "RLSStoreErrors": false, "RLSStoreErrorPolicyAnswers": false, "RLSHighDenialRatio": false, "RLSLimitKeysFull": false}
	for _, q := range qs {
		name := strings.TrimPrefix(q.where, alertRules+": ")
		if _, ok := want[name]; ok {
			want[name] = true
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("%s: no alert %s", alertRules, name)
		}
	}
}

// TestDashboard: every panel and variable query of the dashboard parses
// and queries only what rls exports.
func TestDashboard(t *testing.T) {
	qs := dashboardQueries(t)
	e := rlsSeries(t)
	queried := map[string]bool{}
	for _, q := range qs {
		for _, p := range checkQuery(q, e) {
			t.Error(p)
		}
		if expr, err := parser.NewParser(parser.Options{}).ParseExpr(q.expr); err == nil {
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok {
					queried[vs.Name] = true
				}
				return nil
			})
		}
	}
	// What the issue asks the dashboard to show.
	for _, m := range []string{"rls_decisions_total", "rls_requests_total", "rls_store_duration_seconds_bucket", "rls_store_errors_total", "rls_deny_cache_hits_total", "rls_config_reloads_total", "rls_config_last_reload_successful", "rls_limit_keys_fullness"} {
		if !queried[m] {
			t.Errorf("%s: no panel queries %s", dashboard, m)
		}
	}
	var unused []string
	for name := range e {
		if strings.HasPrefix(name, "rls_") && !queried[name] {
			unused = append(unused, name)
		}
	}
	sort.Strings(unused)
	t.Logf("rls metrics no panel shows: %v", unused)
}

// TestQueryCheckCatches: the check reports a metric rls does not export, a
// label or value it does not have, and a grouping by a missing label.
func TestQueryCheckCatches(t *testing.T) {
	e := exported{}
	e.add("rls_requests_total", nil, "code", "OK", "code", "OVER_LIMIT")
	for _, tc := range []struct{ expr, want string }{
		{`rate(rls_request_total[5m])`, "rls_request_total is not a metric rls exports"},
		{`rls_requests_total{cod="OK"}`, `no label "cod"`},
		{`rls_requests_total{code="DENIED"}`, `no such value`},
		{`rls_requests_total{code=~"OK|DENIED"}`, `no such value`},
		{`sum by (domain) (rls_requests_total)`, "by (domain)"},
		{`sum(rate(rls_requests_total[5m]`, "unclosed"},
	} {
		got := strings.Join(checkQuery(query{"test", tc.expr}, e), "\n")
		if !strings.Contains(got, tc.want) {
			t.Errorf("checkQuery(%s) = %q, want a problem with %q", tc.expr, got, tc.want)
		}
	}
	if got := checkQuery(query{"test", `sum by (code, job) (rate(rls_requests_total{job=~".*", code=~"OK|OVER_LIMIT"}[5m])) / up`}, e); len(got) != 0 {
		t.Errorf("a good query: %v", got)
	}
}
