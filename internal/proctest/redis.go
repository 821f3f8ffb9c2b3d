package proctest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// RedisInstall says how to install redis-server, for the message of a test
// that cannot find it (a test fails then, it never skips).
const RedisInstall = "install it: apt-get install -y redis-server (Debian/Ubuntu), brew install redis (macOS); `make test` does it when run as root"

// The variables that name the Redis-protocol server the tests run against
// (Valkey's valkey-server, a Redis built by hand) and its command-line
// client, for `make test-store`: a server so named always wins over
// redis-server in PATH and over a container.
const (
	EnvRedisServer = "RLS_TEST_REDIS_SERVER"
	EnvRedisCLI    = "RLS_TEST_REDIS_CLI"
)

// RedisServer returns the path of the server the tests start: the one
// RLS_TEST_REDIS_SERVER names, else redis-server in PATH.
func RedisServer() (string, error) { return redisBinary(EnvRedisServer, "redis-server") }

// RedisCLI returns the path of the command-line client that goes with it:
// the one RLS_TEST_REDIS_CLI names, else redis-cli in PATH.
func RedisCLI() (string, error) { return redisBinary(EnvRedisCLI, "redis-cli") }

// RedisNamed reports whether RLS_TEST_REDIS_SERVER names the server.
func RedisNamed() bool { return os.Getenv(EnvRedisServer) != "" }

func redisBinary(env, name string) (string, error) {
	if p := os.Getenv(env); p != "" {
		bin, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("%s=%s: %w", env, p, err)
		}
		return bin, nil
	}
	bin, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found in PATH (or name one in %s): %s", name, env, RedisInstall)
	}
	return bin, nil
}

// RedisVersion returns the first line that the server the tests start
// prints of its version (`--version`), e.g. "Redis server v=7.0.15 ...",
// "Valkey server v=8.0.1 ...".
func RedisVersion() (string, error) {
	bin, err := RedisServer()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}

// RedisArgs are the arguments of a redis-server on 127.0.0.1:port that
// keeps nothing (no snapshot, no append-only file) and whose files go to
// dir, then more: a later argument overrides an earlier one.
func RedisArgs(port int, dir string, more ...string) []string {
	return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}, more...)
}

// LaunchRedis starts redis-server with RedisArgs(port, dir, more...) and
// waits until it answers PING. The caller stops it on every path.
func LaunchRedis(o Options, port int, dir string, more ...string) (*Proc, error) {
	bin, err := RedisServer()
	if err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = "redis-server"
	}
	p, err := Launch(o, append([]string{bin}, RedisArgs(port, dir, more...)...)...)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := p.WaitFor(RedisPONG(addr)); err != nil {
		p.Stop()
		return nil, fmt.Errorf("redis-server on %s: %w\n%s", addr, err, p.Output())
	}
	return p, nil
}

// StartRedis starts, for a test, a redis-server with RedisArgs on a free
// loopback port, its files in a TempDir, and waits until it answers PING.
// It returns the address and the process (for a test that stops Redis
// itself); the test's end stops it. A missing redis-server fails the test.
// Tests that want a Redis to talk to, with TLS, a password, a cluster or
// faults, use internal/redistest; this is the bare process, for a module
// (deploy/) that does not carry redistest's dependencies.
func StartRedis(tb testing.TB, more ...string) (string, *Proc) {
	tb.Helper()
	bin, err := RedisServer()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	p, addr := StartListening(tb, Options{Name: "redis-server"}, func(addr string) []string {
		_, port, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(port)
		return append([]string{bin}, RedisArgs(n, dir, more...)...)
	}, RedisPONG)
	return addr, p
}
