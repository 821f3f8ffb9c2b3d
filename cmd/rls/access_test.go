package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestAdminRequireToken: rls serve --admin-require-token (or
// RLS_ADMIN_REQUIRE_TOKEN) makes /admin/ and /debug/ want the bearer
// token of --admin-token-file from loopback clients too; rls reset and
// rls explain send it with --token-file. The token file is read again
// while rls runs: a rotation to a token of the same length, written with
// the old modification time, applies.
func TestAdminRequireToken(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "limits.yaml", resetConfig)
	tokenFile := writeFile(t, dir, "token", "s3cret\n")
	if err := os.Chmod(tokenFile, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, how := range []struct {
		name string
		env  []string
		args []string
	}{
		{"flag", nil, []string{"--admin-require-token"}},
		{"RLS_ADMIN_REQUIRE_TOKEN", []string{"RLS_ADMIN_REQUIRE_TOKEN=true"}, nil},
	} {
		t.Run(how.name, func(t *testing.T) {
			if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			s := startServer(t, how.env, append([]string{"--config", cfg, "--admin-token-file", tokenFile}, how.args...)...)
			get := func(path, auth string) int {
				req, _ := http.NewRequest("GET", "http://"+s.httpAddr+path, nil)
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			for _, tc := range []struct {
				path, auth string
				want       int
			}{
				{"/debug/config", "", 401},
				{"/debug/pprof/", "", 401},
				{"/debug/config", "Bearer s3cret", 200},
				{"/debug/pprof/cmdline", "bearer s3cret", 200},
				{"/healthz", "", 200},
				{"/metrics", "", 200},
			} {
				if got := get(tc.path, tc.auth); got != tc.want {
					t.Errorf("GET %s from loopback with %q = %d, want %d", tc.path, tc.auth, got, tc.want)
				}
			}
			cmd := func(args ...string) error {
				return run(context.Background(), args, nil, io.Discard, io.Discard)
			}
			for _, c := range []struct {
				args []string
				code int
			}{
				{[]string{"reset", "--addr", s.httpAddr, "api", "remote_address=1.2.3.4"}, checkFailed},
				{[]string{"explain", "--addr", s.httpAddr, "api", "remote_address=1.2.3.4"}, checkFailed},
				{[]string{"reset", "--addr", s.httpAddr, "--token-file", tokenFile, "api", "remote_address=1.2.3.4"}, 0},
				{[]string{"explain", "--addr", s.httpAddr, "--token-file", tokenFile, "api", "remote_address=1.2.3.4"}, 0},
			} {
				if err := cmd(c.args...); exitCode(err) != c.code && !(c.code == 0 && err == nil) {
					t.Errorf("rls %q = %v (exit %d), want exit %d", c.args, err, exitCode(err), c.code)
				}
			}

			// Rotate to a token of the same length, with the old mtime.
			fi, err := os.Stat(tokenFile)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(tokenFile, []byte("n3wtok\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(tokenFile, fi.ModTime(), fi.ModTime()); err != nil {
				t.Fatal(err)
			}
			s.waitUntil(t, "the rotated token is in force", func() bool { return get("/debug/config", "Bearer n3wtok") == 200 })
			if got := get("/debug/config", "Bearer s3cret"); got != 401 {
				t.Errorf("the old token after the rotation: %d, want 401", got)
			}
		})
	}
}

// TestAdminRequireTokenNeedsTokenFile: --admin-require-token without
// --admin-token-file stops the start (exit 2), saying so; a token file of
// two lines stops it too (exit 1), naming the file.
func TestAdminRequireTokenNeedsTokenFile(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--admin-require-token"}, nil, "--admin-require-token: needs --admin-token-file"},
		{nil, []string{"RLS_ADMIN_REQUIRE_TOKEN=1"}, "RLS_ADMIN_REQUIRE_TOKEN (--admin-require-token): needs --admin-token-file"},
	} {
		_, err := parseServeFlags(tc.args, tc.env, io.Discard)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rls serve %q with %q = %v (exit %d), want exit 2 and %q", tc.args, tc.env, err, exitCode(err), tc.want)
		}
	}
	dir := t.TempDir()
	two := writeFile(t, dir, "token", "a\nb\n")
	// Bounded: were the file taken, rls would serve until ctx ends.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := run(ctx, []string{"serve", "--config", writeFile(t, dir, "limits.yaml", resetConfig),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-token-file", two}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), two) || !strings.Contains(err.Error(), "a second non-empty line") {
		t.Errorf("rls serve with a two-line token file = %v, want an error naming the file and its second line", err)
	}
}
