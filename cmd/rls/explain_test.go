package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/servetest"
)

// TestExplainCommand: rls explain against a served config/limits.yaml says
// what each descriptor matched or why not, with each limit's state, and
// consumes nothing.
func TestExplainCommand(t *testing.T) {
	s := startServer(t, nil, "--config", "../../config/limits.yaml")
	explain := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"explain", "--addr", s.httpAddr}, args...), nil, &out, io.Discard)
		return out.String(), err
	}
	if err := run(context.Background(), []string{"check", "--addr", s.grpcAddr, "-n", "3", "api", "remote_address=203.0.113.7"}, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	for range 2 { // twice: the first consumed nothing
		out, err := explain("api", "remote_address=203.0.113.7", "api_key=k,tier=gold", "user=alice")
		if err != nil {
			t.Fatalf("rls explain = %v\n%s", err, out)
		}
		for _, want := range []string{
			"api: OK if it came now\n",
			`descriptor 0 remote_address=203.0.113.7, 1 hit: matched "remote_address" (../../config/limits.yaml:34:5)`,
			"remote_address/1s 10/second fixed_window enforced: remaining 7, reset 1s\n",
			"remote_address/1h 240/hour sliding_window enforced: remaining 237, reset 1h0m0s\n",
			`descriptor 1 api_key=k,tier=gold, 1 hit: entries[1] (tier=gold): "api_key" has no nested descriptors`,
			`descriptor 2 user=alice, 1 hit: entries[0] (user=alice): no descriptor has key "user" at the top level (keys there: remote_address, api_key, path, tenant)`,
		} {
			if !strings.Contains(squeeze(out), squeeze(want)) {
				t.Errorf("rls explain printed\n%s\nwant a line with\n%s", out, want)
			}
		}
	}

	out, err := explain("--hits", "101", "api", "api_key=k")
	if err != nil || !strings.Contains(out, "api: OVER_LIMIT if it came now, and it never passes as it is") ||
		!strings.Contains(out, "token_bucket burst 100") || !strings.Contains(out, "never admits these hits") {
		t.Errorf("rls explain --hits 101 api api_key=k = %v:\n%s\nwant OVER_LIMIT, never, and the bucket that never admits 101", err, out)
	}

	out, err = explain("--path", "/api/v1/admin/x", "--client", "203.0.113.9", "api")
	if err != nil || !strings.Contains(out, "http_descriptors[1] (../../config/limits.yaml:25:5): no descriptor: action 0 (request_headers): no header \"x-api-key\"") ||
		!strings.Contains(out, `descriptor 1 path=/api/v1/admin/x, 1 hit: matched "path=/api/v1/admin/*"`) {
		t.Errorf("rls explain (HTTP form) = %v:\n%s", err, out)
	}

	out, err = explain("--json", "api", "remote_address=203.0.113.7")
	var ex struct {
		Code        string `json:"code"`
		Descriptors []struct {
			Match struct{ Result string } `json:"match"`
		} `json:"descriptors"`
	}
	if err != nil || json.Unmarshal([]byte(out), &ex) != nil || ex.Code != "OK" || ex.Descriptors[0].Match.Result != "matched" {
		t.Errorf("rls explain --json = %v:\n%s", err, out)
	}

	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--addr", s.httpAddr}, 2},
		{[]string{"--addr", s.httpAddr, "--path", "/", "api", "k=v"}, 2},
		{[]string{"--addr", s.httpAddr, "api", "novalue"}, 2},
		{[]string{"--addr", servetest.Addr(t), "api", "k=v"}, checkFailed},
	} {
		if err := run(context.Background(), append([]string{"explain"}, tc.args...), nil, io.Discard, io.Discard); exitCode(err) != tc.code {
			t.Errorf("rls explain %v = %v (exit %d), want exit %d", tc.args, err, exitCode(err), tc.code)
		}
	}
}

// squeeze turns each run of spaces into one, so that tests do not depend
// on column widths.
func squeeze(s string) string {
	for strings.Contains(s, "  ") {
		s = strings.ReplaceAll(s, "  ", " ")
	}
	return s
}

// TestExplainTextShowsPenaltyBlock: rls explain without --json shows what
// --json shows of a penalty: the ladder of every penalized limit, and the
// block in force with its end. It printed neither: a blocked address
// read as a plain denial.
func TestExplainTextShowsPenaltyBlock(t *testing.T) {
	s := startServer(t, nil, "--config", "../../config/examples/penalty.yaml")
	// Five a minute; the sixth is a strike: blocked for 2m.
	run(context.Background(), []string{"check", "--addr", s.grpcAddr, "-n", "6", "login", "remote_address=203.0.113.7"}, nil, io.Discard, io.Discard)
	explain := func(ip string) string {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"explain", "--addr", s.httpAddr, "login", "remote_address=" + ip}, nil, &out, io.Discard); err != nil {
			t.Fatalf("rls explain login remote_address=%s = %v\n%s", ip, err, out.String())
		}
		return out.String()
	}
	const ladder = "    penalty 2m0s, 10m0s, 1h0m0s, starting over after 24h0m0s without a denial"
	out := explain("203.0.113.7")
	if !strings.Contains(out, ladder+"; blocked for 2m0s, until ") || !strings.Contains(out, ": every request denied\n") {
		t.Errorf("rls explain of a blocked address printed\n%s\nwant the line\n%s; blocked for 2m0s, until ...: every request denied", out, ladder)
	}
	out = explain("203.0.113.8")
	if !strings.Contains(out, ladder+"\n") || strings.Contains(out, "blocked") {
		t.Errorf("rls explain of an address not blocked printed\n%s\nwant the line\n%s\nand no block", out, ladder)
	}
}

// penaltyLine at a fixed instant: nothing for a limit without a penalty,
// the ladder, and the block's end as now plus what is left of it.
func TestPenaltyLine(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	ladder := httpapi.LimitExplanation{Penalty: []string{"2m0s", "10m0s"}, PenaltyReset: "24h0m0s"}
	blocked := ladder
	blocked.State = &httpapi.LimitState{BlockedFor: "1m30s"}
	notBlocked := ladder
	notBlocked.State = &httpapi.LimitState{Remaining: 3, Reset: "40s", Admits: true}
	for _, tc := range []struct {
		name string
		l    httpapi.LimitExplanation
		want string
	}{
		{"no penalty", httpapi.LimitExplanation{State: &httpapi.LimitState{BlockedFor: "1m"}}, ""},
		{"the ladder, no state", ladder, "penalty 2m0s, 10m0s, starting over after 24h0m0s without a denial"},
		{"not blocked", notBlocked, "penalty 2m0s, 10m0s, starting over after 24h0m0s without a denial"},
		{"blocked", blocked, "penalty 2m0s, 10m0s, starting over after 24h0m0s without a denial; blocked for 1m30s, until 2025-03-01T12:01:30Z: every request denied"},
	} {
		if got := penaltyLine(tc.l, now); got != tc.want {
			t.Errorf("%s: penaltyLine = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// reserveLine: nothing for a limit that does not reserve; the reserve
// alone without the state; with it, what the counter holds and what the
// call would do.
func TestReserveLine(t *testing.T) {
	reserve := func(call string, held uint64, holds uint32, oldest string) httpapi.LimitExplanation {
		return httpapi.LimitExplanation{
			Reserve: &httpapi.ReserveExplanation{Estimate: 4000, TTL: "5m0s", Call: call, Held: held, Holds: holds, OldestHold: oldest},
			State:   &httpapi.LimitState{Remaining: 2000},
		}
	}
	noState := reserve("", 0, 0, "")
	noState.State = nil
	for _, tc := range []struct {
		name string
		l    httpapi.LimitExplanation
		want string
	}{
		{"no reserve", httpapi.LimitExplanation{State: &httpapi.LimitState{}}, ""},
		{"no state", noState, "reserve 4000 for 5m0s"},
		{"nothing held, no id", reserve("none", 0, 0, ""), "reserve 4000 for 5m0s: nothing held; this call has no request id: it neither reserves nor settles"},
		{"one hold, a reserve", reserve("reserve", 4000, 1, "2s"), "reserve 4000 for 5m0s: 4000 held by 1 reservation, 2s old; this call would reserve"},
		{"holds, a settle", reserve("settle", 8000, 2, "30s"), "reserve 4000 for 5m0s: 8000 held by 2 reservations, the oldest 30s old; this call would settle its hold"},
		{"a second settle", reserve("settled_again", 4000, 1, "1s"), "reserve 4000 for 5m0s: 4000 held by 1 reservation, 1s old; this call would settle again: nothing charged"},
		{"a hold that ended", reserve("settle_unheld", 0, 0, ""), "reserve 4000 for 5m0s: nothing held; this call's hold ended by itself: its hits would be charged"},
	} {
		if got := reserveLine(tc.l); got != tc.want {
			t.Errorf("%s: reserveLine = %q, want %q", tc.name, got, tc.want)
		}
	}
}
