package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/redistest"
)

const overrideConfig = `
domain: api
descriptors:
  - key: tenant
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: day, requests_per_unit: 1000, name: daily}
`

// TestOverrideCommand: rls override sets, lists and deletes overrides of
// a running rls, which decides with them at once (and a second rls on the
// same Redis too, once it has applied them); they survive a restart of
// rls (in Redis; in --overrides-file on the memory store); each change is
// logged with who made it and what it changed; an override of no limit
// is refused, a delete of none exits 4.
func TestOverrideCommand(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			ctx := context.Background()
			args := []string{"--config", writeFile(t, t.TempDir(), "limits.yaml", overrideConfig)}
			if store == "redis" {
				args = append(args, "--store", "redis", "--redis-url", redistest.Start(t).URL())
			} else {
				args = append(args, "--overrides-file", filepath.Join(t.TempDir(), "overrides.json"))
			}
			a := startServer(t, nil, args...)
			var b *server
			if store == "redis" {
				b = startServer(t, nil, args...)
			}
			cmd := func(s *server, argv ...string) (string, int) {
				t.Helper()
				var out bytes.Buffer
				err := run(ctx, append([]string{"override", argv[0], "--addr", s.httpAddr}, argv[1:]...), nil, &out, io.Discard)
				if err == nil {
					return out.String(), 0
				}
				return out.String() + err.Error(), exitCode(err)
			}
			checks := func(s *server, n int) int { // how many of n requests are admitted
				t.Helper()
				admitted := 0
				for range n {
					if err := run(ctx, []string{"check", "--addr", s.grpcAddr, "api", "tenant=acme"}, nil, io.Discard, io.Discard); err == nil {
						admitted++
					}
				}
				return admitted
			}
			out, code := cmd(a, "set", "api", "tenant=acme", "--requests-per-unit", "3", "--reason", "trial")
			if code != 0 || !strings.Contains(out, "active: tenant/1m, daily") || !strings.Contains(out, "trial") {
				t.Fatalf("rls override set = %d\n%s", code, out)
			}
			if got := checks(a, 5); got != 3 {
				t.Errorf("5 requests under the override of 3: %d admitted", got)
			}
			if b != nil {
				b.waitUntil(t, "the second rls applies the override", func() bool {
					out, _ := cmd(b, "list", "api")
					return strings.Contains(out, "tenant=acme")
				})
				if got := checks(b, 2); got != 0 {
					t.Errorf("the second rls, same counter, 3 of 3 used: %d of 2 admitted", got)
				}
			}
			// Raised with a name: the daily limit only; the minute's stays 3.
			if out, code := cmd(a, "set", "api", "tenant=acme", "--name", "daily", "--requests-per-unit", "5000", "--ttl", "2h"); code != 0 || strings.Contains(out, "never") || !strings.Contains(out, "5000") {
				t.Errorf("rls override set --name daily --ttl 2h = %d\n%s", code, out)
			}
			out, _ = cmd(a, "list")
			if !strings.Contains(out, "api     tenant=acme  *      3") || !strings.Contains(out, "api     tenant=acme  daily  5000") {
				t.Errorf("rls override list:\n%s", out)
			}
			// Refused: no limit; a bad value; a delete of none.
			if out, code := cmd(a, "set", "api", "nope=x", "--requests-per-unit", "1"); code != checkFailed || !strings.Contains(out, "400 Bad Request: the override matches no limit of the loaded config") {
				t.Errorf("rls override set of no limit = %d %s, want %d and why", code, out, checkFailed)
			}
			if out, code := cmd(a, "set", "api", "tenant=acme"); code != 2 || !strings.Contains(out, "--requests-per-unit is required") {
				t.Errorf("rls override set without --requests-per-unit = %d %s, want 2", code, out)
			}
			if out, code := cmd(a, "delete", "api", "tenant=nobody"); code != overrideNotFound || !strings.Contains(out, "404") {
				t.Errorf("rls override delete of none = %d %s, want %d", code, out, overrideNotFound)
			}
			a.waitUntil(t, "rls logs the change, by whom, before and after", func() bool {
				l := a.logs.String()
				return strings.Contains(l, `msg="override set" by="loopback 127.0.0.1:`) && strings.Contains(l, `override="api tenant=acme" before=none after="requests_per_unit=3"`)
			})
			// A restart keeps them.
			a.stop(t)
			if b != nil {
				b.stop(t)
			}
			a = startServer(t, nil, args...)
			out, _ = cmd(a, "list", "api")
			if !strings.Contains(out, "tenant=acme  *      3") || !strings.Contains(out, "daily  5000") {
				t.Errorf("after a restart, rls override list:\n%s", out)
			}
			if out, code := cmd(a, "delete", "api", "tenant=acme"); code != 0 || !strings.Contains(out, "deleted api tenant=acme") {
				t.Errorf("rls override delete = %d %s", code, out)
			}
			if out, code := cmd(a, "delete", "api", "tenant=acme", "--name", "daily"); code != 0 {
				t.Errorf("rls override delete --name daily = %d %s", code, out)
			}
			if out, _ := cmd(a, "list"); out != "no overrides\n" {
				t.Errorf("rls override list after the deletes: %q", out)
			}
		})
	}
}
