package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/redistest"
)

const insightConfig = `
domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: %d}
`

func limitsFile(t *testing.T, dir, name string, perDay int) string {
	t.Helper()
	return writeFile(t, dir, name, fmt.Sprintf(insightConfig, perDay))
}

// getTopJSON asks rls's GET /debug/top.
func getTopJSON(t *testing.T, httpAddr, query string) httpapi.TopResult {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"top", "--json", "--addr", httpAddr, query}, nil, &out, io.Discard); err != nil {
		t.Fatalf("rls top --json: %v", err)
	}
	var res httpapi.TopResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("GET /debug/top: %v\n%s", err, out.String())
	}
	return res
}

// TestTopAndReplay: rls serve with a decision log; rls top shows the key
// being limited with the command that resets it; rls replay of the log
// under the config that wrote it changes nothing, and under a halved
// limit says what changes, --max-changed 0 then exiting 1.
func TestTopAndReplay(t *testing.T) {
	dir := t.TempDir()
	cfg := limitsFile(t, dir, "limits.yaml", 3)
	half := limitsFile(t, dir, "half.yaml", 1)
	logPath := filepath.Join(dir, "decisions.log")
	s := startServer(t, nil, "--config", cfg, "--decision-log", logPath)
	ctx := context.Background()
	for _, c := range []struct {
		ip string
		n  string
	}{{"203.0.113.7", "5"}, {"203.0.113.8", "2"}} {
		run(ctx, []string{"check", "--addr", s.grpcAddr, "-n", c.n, "api", "remote_address=" + c.ip}, nil, io.Discard, io.Discard)
	}
	res := getTopJSON(t, s.httpAddr, "api")
	if res.Processes != 1 || len(res.Limits) != 1 || len(res.Limits[0].Keys) != 1 {
		t.Fatalf("GET /debug/top?domain=api: %+v, want the one limit with one key denied", res)
	}
	k := res.Limits[0].Keys[0]
	if k.Descriptor[0].Value != "203.0.113.7" || k.Denied != 2 || k.Admitted != 3 || k.Fullness != 1 {
		t.Errorf("top key %+v, want 203.0.113.7 denied 2, admitted 3, full", k)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"top", "--once", "--addr", s.httpAddr, "api"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1 rls process\n", "api remote_address/1d (remote_address, limit 3)", "203.0.113.7", "rls reset --addr " + s.httpAddr + " api remote_address=203.0.113.7",
		"explain:  rls explain --addr " + s.httpAddr + " api remote_address=203.0.113.7"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("rls top --once printed\n%s\nwant %q", out.String(), want)
		}
	}
	// The log's counters are on /metrics: the 7 decisions written (by the
	// time the writer has caught up), none dropped.
	s.waitUntil(t, "rls_decision_log_records_total reads 7", func() bool {
		return scrapeLines(t, "http://"+s.httpAddr+"/metrics")["rls_decision_log_records_total"] == "7"
	})
	if v := scrapeLines(t, "http://"+s.httpAddr+"/metrics")["rls_decision_log_dropped_total"]; v != "0" {
		t.Errorf("rls_decision_log_dropped_total = %q, want 0", v)
	}
	s.stop(t) // the log is flushed

	out.Reset()
	if err := run(ctx, []string{"replay", "--config", cfg, logPath}, nil, &out, io.Discard); err != nil {
		t.Fatalf("rls replay under the config that wrote the log: %v\n%s", err, out.String())
	}
	for _, want := range []string{"replayed 7 decisions", "the baseline gives the logged code to 7 of 7 decisions", "changed: 0 decisions"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("rls replay printed\n%s\nwant %q", out.String(), want)
		}
	}
	out.Reset()
	err := run(ctx, []string{"replay", "--config", half, "--max-changed", "0", "--json", logPath}, nil, &out, io.Discard)
	if exitCode(err) != 1 {
		t.Errorf("rls replay --max-changed 0 of a halved limit: %v (exit %d), want exit 1", err, exitCode(err))
	}
	var rep struct {
		Decisions, Changed int
		Limits             []struct {
			Domain, Name        string
			Descriptor          []httpapi.EntryJSON
			Baseline, Candidate struct{ Admitted, Denied int }
		}
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("rls replay --json: %v\n%s", err, out.String())
	}
	if rep.Decisions != 7 || rep.Changed != 3 || len(rep.Limits) != 1 || rep.Limits[0].Baseline.Denied != 2 || rep.Limits[0].Candidate.Denied != 5 ||
		rep.Limits[0].Name != "remote_address/1d" || rep.Limits[0].Descriptor[0].Key != "remote_address" {
		t.Errorf("rls replay --json of a halved limit:\n%s\nwant 7 decisions, 3 changed, denied 2 then 5", out.String())
	}
	if err := run(ctx, []string{"replay", "--config", cfg, filepath.Join(dir, "nope.log")}, nil, io.Discard, io.Discard); exitCode(err) != replayFailed {
		t.Errorf("rls replay of a missing log: %v, want exit %d", err, replayFailed)
	}
}

// TestTopMergesProcessesOnRedis: two rls sharing a Redis each publish
// their top keys; either one's GET /debug/top merges both.
func TestTopMergesProcessesOnRedis(t *testing.T) {
	dir := t.TempDir()
	cfg := limitsFile(t, dir, "limits.yaml", 3)
	url := redistest.Start(t).URL()
	var servers []*server
	for range 2 {
		servers = append(servers, startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-url", url, "--top-keys-publish", "50ms", "--store-timeout", "1s"))
	}
	ctx := context.Background()
	for _, s := range servers {
		run(ctx, []string{"check", "--addr", s.grpcAddr, "-n", "4", "api", "remote_address=203.0.113.9"}, nil, io.Discard, io.Discard)
	}
	// Each merges its own keys with the other's latest summary, published
	// every 50 ms: both come to the same view.
	for i, s := range servers {
		var res httpapi.TopResult
		s.waitUntil(t, fmt.Sprintf("process %d's GET /debug/top merges 2 processes", i), func() bool {
			res = getTopJSON(t, s.httpAddr, "api")
			return res.Processes == 2 && len(res.Limits) == 1 && len(res.Limits[0].Keys) == 1 && res.Limits[0].Keys[0].Denied == 5
		})
		if k := res.Limits[0].Keys[0]; k.Admitted != 3 || k.Fullness != 1 {
			t.Errorf("process %d's GET /debug/top: %+v, want the key admitted 3 times, full", i, res)
		}
	}
}

// screens is rls top's terminal: it counts the screens cleared and ends
// rls top (cancel) once it has cleared max.
type screens struct {
	buf    bytes.Buffer // not embedded: its WriteString would bypass Write
	n, max int
	cancel func()
}

func (s *screens) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("\x1b[H\x1b[2J")) {
		if s.n++; s.n == s.max {
			s.cancel()
		}
	}
	return s.buf.Write(p)
}

// TestTopRefreshes: without --once, rls top clears the screen and shows
// GET /debug/top again every --interval, as top does, until it is
// interrupted (exit 0); the heaviest key of each limit comes with its
// explain and override command lines, naming the --addr rls top read.
func TestTopRefreshes(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/top" || r.URL.Query().Get("domain") != "partners" {
			http.Error(w, "unexpected "+r.URL.String(), http.StatusNotFound)
			return
		}
		n := calls.Add(1)
		c := &httpapi.TopCommands{Explain: "rls explain partners remote_address=203.0.113.7", Reset: "rls reset partners remote_address=203.0.113.7",
			Override: "rls override set partners remote_address=203.0.113.7 --requests-per-unit 0 --ttl 1h --reason 'rls top: remote_address/1d'"}
		json.NewEncoder(w).Encode(httpapi.TopResult{Processes: 1, By: "denied", Limits: []httpapi.TopLimit{{Domain: "partners", Name: "remote_address/1d",
			Descriptor: []httpapi.EntryJSON{{Key: "remote_address"}}, Denials: uint64(n), Decisions: uint64(5 + n),
			Keys: []httpapi.TopKey{{Descriptor: []httpapi.EntryJSON{{Key: "remote_address", Value: "203.0.113.7"}}, Denied: uint64(n), Admitted: 5, Fullness: 1, Commands: c}}}}})
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &screens{max: 3, cancel: cancel}
	if err := run(ctx, []string{"top", "--interval", "1ms", "--addr", srv.URL, "partners"}, nil, out, io.Discard); err != nil {
		t.Fatalf("rls top: %v, want nil once interrupted", err)
	}
	views := strings.Split(out.buf.String(), "\x1b[H\x1b[2J")[1:]
	if len(views) != 3 {
		t.Fatalf("rls top showed %d screens, want 3:\n%q", len(views), out.buf.String())
	}
	for i, v := range views {
		if want := fmt.Sprintf("%d decisions, %d denied", 6+i, 1+i); !strings.Contains(v, want) {
			t.Errorf("screen %d:\n%s\nwant %q (refreshed)", i+1, v, want)
		}
	}
	for _, want := range []string{
		"rls reset --addr " + srv.URL + " partners remote_address=203.0.113.7",
		"explain:  rls explain --addr " + srv.URL + " partners remote_address=203.0.113.7",
		"override: rls override set --addr " + srv.URL + " partners remote_address=203.0.113.7 --requests-per-unit 0 --ttl 1h",
	} {
		if !strings.Contains(views[0], want) {
			t.Errorf("screen 1:\n%s\nwant %q", views[0], want)
		}
	}
}

// TestDecisionLogFlags: the hash key is read from its file (trimmed) and
// must be long enough; the sample is in (0, 1]; the sample and the hash key
// need --decision-log; the log's bounds are checked; --decision-log -
// writes to rls's stdout.
func TestDecisionLogFlags(t *testing.T) {
	dir := t.TempDir()
	key := writeFile(t, dir, "key", "  0123456789abcdef0123  \n")
	short := writeFile(t, dir, "short", "secret\n")
	cfg, err := parseServeFlags([]string{"--decision-log", "d.log", "--decision-log-hash-key", key, "--decision-log-sample", "0.25",
		"--decision-log-max-size", "1MiB", "--decision-log-backups", "0", "--decision-log-queue", "16"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.DecisionLog; string(d.HashKey) != "0123456789abcdef0123" || d.Sample != 0.25 || d.MaxBytes != 1<<20 || d.Backups != 0 || d.Queue != 16 || d.Path != "d.log" {
		t.Errorf("decision log options %+v", d)
	}
	var stdout bytes.Buffer
	if cfg, err := parseServeFlags([]string{"--decision-log", "-"}, nil, &stdout); err != nil || cfg.DecisionLog.Stdout != &stdout {
		t.Errorf("--decision-log -: %v, stdout %v; want rls's stdout", err, cfg.DecisionLog.Stdout)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--decision-log", "d.log", "--decision-log-hash-key", short}, "fewer than 16"},
		{[]string{"--decision-log", "d.log", "--decision-log-hash-key", filepath.Join(dir, "none")}, "no such file"},
		{[]string{"--decision-log", "d.log", "--decision-log-sample", "0"}, "not in (0, 1]"},
		{[]string{"--decision-log", "d.log", "--decision-log-sample", "1.5"}, "not in (0, 1]"},
		{[]string{"--decision-log-sample", "0.5"}, "need --decision-log"},
		{[]string{"--decision-log-hash-key", key}, "need --decision-log"},
		{[]string{"--decision-log", "d.log", "--decision-log-max-size", "100"}, "4096 bytes or more"},
		{[]string{"--decision-log", "d.log", "--decision-log-queue", "0"}, "less than 1"},
		{[]string{"--top-keys", "-1"}, "between 0 and 10000"},
	} {
		_, err := parseServeFlags(bad.args, nil, io.Discard)
		if err == nil || !strings.Contains(err.Error(), bad.want) || exitCode(err) != 2 {
			t.Errorf("rls serve %s: %v (exit %d), want exit 2 saying %q", strings.Join(bad.args, " "), err, exitCode(err), bad.want)
		}
	}
}
