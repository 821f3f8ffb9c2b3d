package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/servetest"
)

// This test drives the real stack with the docker CLI (`docker compose`)
// rather than testcontainers-go's compose module: that module links the
// docker CLI, docker/compose and buildkit into the test (about 140 modules,
// a minute of cold build), for what four CLI calls do here.

// dockerEngine finds the Docker engine the docker CLI would use and pings
// it: DOCKER_HOST, else the first socket present of the system one,
// rootless Docker's and Docker Desktop's. It returns at once when there is
// no socket, and when ctx ends when nothing answers.
func dockerEngine(ctx context.Context) (string, error) {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		candidates := []string{"/var/run/docker.sock"}
		if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
			candidates = append(candidates, filepath.Join(dir, "docker.sock"))
		}
		if home, err := os.UserHomeDir(); err == nil {
			candidates = append(candidates, filepath.Join(home, ".docker", "run", "docker.sock"))
		}
		host = "unix://" + candidates[0]
		for _, c := range candidates {
			if _, err := os.Stat(c); err == nil {
				host = "unix://" + c
				break
			}
		}
	}
	u, err := url.Parse(host)
	if err != nil {
		return host, err
	}
	var network, addr string
	switch u.Scheme {
	case "unix":
		network, addr = "unix", u.Path
		if _, err := os.Stat(addr); err != nil {
			return host, err
		}
	case "tcp":
		if os.Getenv("DOCKER_TLS_VERIFY") != "" {
			return host, fmt.Errorf("a TLS engine (DOCKER_TLS_VERIFY) is not probed by this test")
		}
		network, addr = "tcp", u.Host
	default:
		return host, fmt.Errorf("scheme %q is not probed by this test", u.Scheme)
	}
	client := &http.Client{
		Timeout: time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", nil)
	if err != nil {
		return host, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return host, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return host, fmt.Errorf("GET /_ping: %s", resp.Status)
	}
	return host, nil
}

// TestDockerEngineProbe checks the probe that decides whether
// TestComposeEndToEnd runs: an engine that answers /_ping is found; a
// missing one is reported at once and a mute one when the probe's context
// ends (TestComposeEndToEnd gives it a second).
func TestDockerEngineProbe(t *testing.T) {
	dir := t.TempDir()
	serve := func(name string, handler http.HandlerFunc) string {
		sock := filepath.Join(dir, name)
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatalf("listening on a unix socket: %v", err)
		}
		srv := &http.Server{Handler: handler}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		return sock
	}
	engine := serve("engine.sock", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_ping" {
			io.WriteString(w, "OK")
			return
		}
		http.NotFound(w, r)
	})
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	mute := serve("mute.sock", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	})

	// The probe's context: 100 ms for the mute engine, whose answer is the
	// context's end; 10 s for the others, which answer without waiting it
	// out (100 ms for an engine's /_ping was too tight for a machine slowed
	// by the race detector and other tests).
	const mutePatience, patience = 100 * time.Millisecond, 10 * time.Second
	tests := []struct {
		name, host string
		timeout    time.Duration
		wantErr    string // "" for an engine found
	}{
		{"engine", "unix://" + engine, patience, ""},
		{"no socket", "unix://" + filepath.Join(dir, "none.sock"), patience, "no such file"},
		{"mute engine", "unix://" + mute, mutePatience, "context deadline exceeded"},
		{"ssh", "ssh://user@host", patience, `scheme "ssh" is not probed`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("DOCKER_HOST", tt.host)
			ctx, cancel := context.WithTimeout(t.Context(), tt.timeout)
			defer cancel()
			_, err := dockerEngine(ctx)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("dockerEngine(%s) = %v, want nil", tt.host, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("dockerEngine(%s) = %v, want an error containing %q", tt.host, err, tt.wantErr)
			}
		})
	}
}

// freePorts returns n TCP ports free on the loopback interface now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		if p := servetest.FreePort(t); !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports
}

// stack is one docker compose project of docker-compose.yaml.
type stack struct {
	t       *testing.T
	project string
	env     []string
}

// compose runs `docker compose` on the project and returns its combined
// output.
func (s *stack) compose(ctx context.Context, args ...string) (string, error) {
	composePath, err := filepath.Abs(composeFile)
	if err != nil {
		return "", err
	}
	full := append([]string{"compose", "-f", composePath, "-p", s.project}, args...)
	cmd := exec.CommandContext(ctx, "docker", full...)
	cmd.Env = s.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	s.t.Logf("docker %s", strings.Join(full, " "))
	err = cmd.Run()
	return out.String(), err
}

// TestComposeEndToEnd starts docker-compose.yaml (envoy, rls on Redis,
// redis, backend), checks envoy.yaml with the real Envoy of the pinned
// image, and sends requests through both Envoy listeners until rls limits
// them: 200s with rate-limit headers, then a 429 with X-RateLimit-*,
// RateLimit-Policy and Retry-After. It needs a Docker engine with the
// compose plugin and network access to pull the images; elsewhere it
// skips, and envoy/envoy_config_test.go and the other tests of this
// package check the same files statically.
func TestComposeEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: this test builds images and starts containers")
	}
	probe, cancel := context.WithTimeout(t.Context(), time.Second)
	host, err := dockerEngine(probe)
	cancel()
	if err != nil {
		t.Skipf("no Docker engine answers at %s (%v): this test needs one; envoy.yaml and docker-compose.yaml are still checked by envoy/envoy_config_test.go and e2e/compose_test.go", host, err)
	}
	if out, err := exec.CommandContext(t.Context(), "docker", "compose", "version").CombinedOutput(); err != nil {
		t.Skipf("a Docker engine answers at %s, but `docker compose version` fails (%v: %s): this test needs the compose plugin (v2)", host, err, bytes.TrimSpace(out))
	}

	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	ports := freePorts(t, 5)
	s := &stack{
		t:       t,
		project: fmt.Sprintf("rlse2e%d", os.Getpid()),
		env: append(os.Environ(),
			fmt.Sprintf("ENVOY_RATELIMIT_PORT=%d", ports[0]),
			fmt.Sprintf("ENVOY_EXTAUTHZ_PORT=%d", ports[1]),
			fmt.Sprintf("ENVOY_ADMIN_PORT=%d", ports[2]),
			fmt.Sprintf("RLS_HTTP_PORT=%d", ports[3]),
			fmt.Sprintf("RLS_GRPC_PORT=%d", ports[4]),
			"RLS_VERSION=e2e",
			// The engine probed above, whatever the CLI's context says.
			"DOCKER_HOST="+host,
		),
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if t.Failed() {
			if out, err := s.compose(ctx, "logs", "--no-color", "--tail", "100"); err == nil {
				t.Logf("logs:\n%s", out)
			}
		}
		if out, err := s.compose(ctx, "down", "--volumes", "--remove-orphans", "--timeout", "5"); err != nil {
			t.Errorf("docker compose down: %v\n%s", err, out)
		}
	})

	// The authoritative check of envoy.yaml, which only Envoy itself can do.
	if out, err := s.compose(ctx, "run", "--rm", "--no-deps", "envoy", "envoy", "--mode", "validate", "-c", "/etc/envoy/envoy.yaml"); err != nil {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
	if out, err := s.compose(ctx, "up", "--detach", "--build", "--wait", "--wait-timeout", "300"); err != nil {
		t.Fatalf("docker compose up: %v\n%s", err, out)
	}

	client := &http.Client{Timeout: 5 * time.Second}
	get := func(port int, path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("X-Api-Key", "e2e")
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, nil
	}
	// waitFor polls until ok says the answer is the one awaited.
	waitFor := func(t *testing.T, what string, port int, path string, timeout time.Duration, ok func(*http.Response) bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			resp, err := get(port, path)
			if err == nil && ok(resp) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (last: %v %v)", what, timeout, statusOf(resp), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitFor(t, "Envoy ready", ports[2], "/ready", time.Minute, func(r *http.Response) bool { return r.StatusCode == http.StatusOK })

	const path = "/api/v1/users"
	t.Run("ratelimit filter", func(t *testing.T) {
		// Until rls answers, Envoy fails open without headers.
		waitFor(t, "rls answering through :10000", ports[0], path, time.Minute, func(r *http.Response) bool {
			return r.StatusCode == http.StatusOK && r.Header.Get("X-RateLimit-Limit") != ""
		})
		denied := untilLimited(t, get, ports[0], path)
		// X-RateLimit-* from Envoy; RateLimit-Policy, RateLimit and
		// Retry-After from rls (--response-headers draft11).
		checkDenied(t, denied, "X-RateLimit-Limit", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After")
		if got := denied.Header.Get("X-Envoy-Ratelimited"); got != "true" {
			t.Errorf("429 with X-Envoy-Ratelimited %q, want true", got)
		}
	})
	t.Run("ext_authz", func(t *testing.T) {
		// Both listeners count the same client: wait for its window to reopen.
		waitFor(t, "a request allowed through :10001", ports[1], path, 10*time.Second, func(r *http.Response) bool {
			return r.StatusCode == http.StatusOK
		})
		denied := untilLimited(t, get, ports[1], path)
		// All from rls's denied_response.
		checkDenied(t, denied, "X-RateLimit-Limit", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After")
	})
}

func statusOf(r *http.Response) string {
	if r == nil {
		return "no response"
	}
	return r.Status
}

// untilLimited sends requests until one is limited and returns it. Before
// it, every answer must be 200 with X-RateLimit-Remaining. The per-second
// limit of remote_address (10) is reached within two windows at most.
func untilLimited(t *testing.T, get func(int, string) (*http.Response, error), port int, path string) *http.Response {
	t.Helper()
	allowed := 0
	for i := 1; i <= 40; i++ {
		resp, err := get(port, path)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		switch resp.StatusCode {
		case http.StatusOK:
			allowed++
			if _, err := strconv.Atoi(resp.Header.Get("X-RateLimit-Remaining")); err != nil {
				t.Errorf("request %d: 200 with X-RateLimit-Remaining %q, want a number", i, resp.Header.Get("X-RateLimit-Remaining"))
			}
		case http.StatusTooManyRequests:
			if allowed == 0 {
				t.Errorf("request %d: 429 before any 200", i)
			}
			t.Logf("request %d: 429 after %d allowed; headers %v", i, allowed, resp.Header)
			return resp
		default:
			t.Fatalf("request %d: %s, want 200 or 429", i, resp.Status)
		}
	}
	t.Fatalf("40 requests, %d allowed, none limited: want a 429 after 10 per second", allowed)
	return nil
}

// checkDenied checks the headers of a 429.
func checkDenied(t *testing.T, r *http.Response, headers ...string) {
	t.Helper()
	for _, h := range headers {
		if r.Header.Get(h) == "" {
			t.Errorf("429 without %s: %v", h, r.Header)
		}
	}
	if got := r.Header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Errorf("429 with X-RateLimit-Remaining %q, want 0", got)
	}
	if n, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || n < 1 {
		t.Errorf("429 with Retry-After %q, want whole seconds >= 1", r.Header.Get("Retry-After"))
	}
}
