package proctest

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
)

// RedisInstall says how to install redis-server, for the message of a test
// that cannot find it (a test fails then, it never skips).
const RedisInstall = "install it: apt-get install -y redis-server (Debian/Ubuntu), brew install redis (macOS); `make test` does it when run as root"

// RedisServer returns the path of redis-server.
func RedisServer() (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found in PATH: %s", RedisInstall)
	}
	return bin, nil
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
