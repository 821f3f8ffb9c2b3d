package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/redistest"
)

const resetConfig = `
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: hour, requests_per_unit: 3}
      - {unit: day, requests_per_unit: 5, algorithm: sliding_window}
      - {unit: hour, requests_per_unit: 4, algorithm: token_bucket}
  - key: user
`

// TestResetCommand: rls reset clears every window of the limits a
// descriptor matches, on the memory store and on Redis, says what it
// cleared, and rls logs it; the descriptor's limits then admit afresh.
func TestResetCommand(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			args := []string{"--config", writeFile(t, t.TempDir(), "reset.yaml", resetConfig)}
			if store == "redis" {
				args = append(args, "--store", "redis", "--redis-url", redistest.Start(t).URL())
			}
			s := startServer(t, nil, args...)
			ip := "remote_address=203.0.113.7"
			if err := run(context.Background(), []string{"check", "--addr", s.grpcAddr, "-n", "3", "api", ip}, nil, io.Discard, io.Discard); err != nil {
				t.Fatal(err)
			}
			if err := run(context.Background(), []string{"check", "--addr", s.grpcAddr, "api", ip}, nil, io.Discard, io.Discard); exitCode(err) == 0 {
				t.Fatalf("the 4th request in an hour admitted: the test's premise")
			}
			var out bytes.Buffer
			if err := run(context.Background(), []string{"reset", "--addr", s.httpAddr, "api", ip, "user=alice"}, nil, &out, io.Discard); err != nil {
				t.Fatalf("rls reset = %v\n%s", err, out.String())
			}
			for _, want := range []string{
				"api remote_address=203.0.113.7: remote_address/1h, remote_address/1d, remote_address/1h/token_bucket\n",
				"api user=alice: no limit\n",
				"3 counters cleared\n",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("rls reset printed\n%s\nwant a line %q", out.String(), want)
				}
			}
			out.Reset()
			if err := run(context.Background(), []string{"explain", "--addr", s.httpAddr, "api", ip}, nil, &out, io.Discard); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"remaining 3,", "remaining 5,", "remaining 4,"} {
				if !strings.Contains(squeeze(out.String()), want) {
					t.Errorf("after the reset, rls explain printed\n%s\nwant %q", out.String(), want)
				}
			}
			s.waitUntil(t, "rls logs the reset", func() bool {
				return strings.Contains(s.logs.String(), "admin reset") && strings.Contains(s.logs.String(), "remote_address=203.0.113.7")
			})
		})
	}
}
