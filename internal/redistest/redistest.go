// Package redistest starts real Redis servers for tests: in a container
// when a Docker engine answers (testcontainers-go), otherwise the
// redis-server binary on a free loopback port; and Redis Clusters of
// redis-server processes. Every server is stopped by the test that started
// it. A test that cannot get Redis fails: `make test` installs redis-server.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

const install = "install it: apt-get install -y redis-server (Debian/Ubuntu), brew install redis (macOS); `make test` does it when run as root"

// Server is one Redis server. Its methods may be called from the test's
// goroutine only.
type Server struct {
	addr string
	dir  string
	port int
	args []string
	cmd  *exec.Cmd // nil in a container
	ctr  testcontainers.Container
	tb   testing.TB
	mu   sync.Mutex
}

// Addr returns host:port.
func (s *Server) Addr() string { return s.addr }

// URL returns a redis:// URL of database 0.
func (s *Server) URL() string { return "redis://" + s.addr + "/0" }

// Start starts a Redis server for the test and stops it when the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if dockerAnswers() {
		ctx := context.Background()
		ctr, err := tcredis.Run(ctx, "redis:7-alpine")
		if err == nil {
			tb.Cleanup(func() { testcontainers.TerminateContainer(ctr) })
			ep, err := ctr.Endpoint(ctx, "")
			if err == nil {
				return &Server{addr: ep, ctr: ctr, tb: tb}
			}
		}
		tb.Logf("redistest: Docker answers but the Redis container failed (%v); using redis-server", err)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redistest: no Docker engine and no redis-server in PATH; %s", install)
	}
	s := &Server{dir: tb.TempDir(), port: freePort(tb), tb: tb}
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.args = []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.dir}
	s.start(bin)
	tb.Cleanup(s.Stop)
	return s
}

// dockerAnswers reports quickly whether a Docker engine is reachable.
func dockerAnswers() bool {
	host := os.Getenv("DOCKER_HOST")
	network, address := "unix", "/var/run/docker.sock"
	switch {
	case strings.HasPrefix(host, "unix://"):
		address = strings.TrimPrefix(host, "unix://")
	case strings.HasPrefix(host, "tcp://"):
		network, address = "tcp", strings.TrimPrefix(host, "tcp://")
	case host != "":
		return false
	}
	c, err := net.DialTimeout(network, address, 300*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "GET /_ping HTTP/1.0\r\n\r\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.Contains(line, " 200 ")
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *Server) start(bin string) {
	s.tb.Helper()
	cmd := exec.Command(bin, s.args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := os.Create(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		s.tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("redistest: starting redis-server: %v", err)
	}
	out.Close()
	s.cmd = cmd
	go cmd.Wait()
	if err := waitPing(s.addr, 10*time.Second); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		s.kill(syscall.SIGKILL)
		s.tb.Fatalf("redistest: redis-server on %s: %v\n%s", s.addr, err, log)
	}
}

// waitPing waits until addr answers PING, within d.
func waitPing(addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if last = ping(addr); last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no PONG within %s: %v", d, last)
}

func ping(addr string) error {
	out, err := Command(addr, "PING")
	if err != nil {
		return err
	}
	if out != "PONG" {
		return fmt.Errorf("PING answered %q", out)
	}
	return nil
}

// Command sends one command in RESP and returns its reply rendered as text
// (bulk and simple strings as they are, integers in decimal, arrays one
// element per line); an error reply is an error.
func Command(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("%s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := ioReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		var parts []string
		for range n {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

func ioReadFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (s *Server) kill(sig syscall.Signal) {
	if s.cmd != nil && s.cmd.Process != nil {
		syscall.Kill(-s.cmd.Process.Pid, sig)
	}
}

func (s *Server) binaryOnly(what string) {
	s.tb.Helper()
	if s.cmd == nil {
		s.tb.Fatalf("redistest: %s needs a redis-server process (not a container)", what)
	}
}

// Stop kills the server and waits until its port is closed. Idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctr != nil {
		testcontainers.TerminateContainer(s.ctr)
		return
	}
	s.kill(syscall.SIGCONT) // a paused server cannot die of SIGKILL late
	s.kill(syscall.SIGKILL)
	waitClosed(s.addr)
}

// Kill kills the server abruptly (SIGKILL), as a crash would.
func (s *Server) Kill() {
	s.binaryOnly("Kill")
	s.Stop()
}

// Restart stops the server and starts an empty one on the same port.
func (s *Server) Restart() {
	s.tb.Helper()
	s.binaryOnly("Restart")
	s.Stop()
	bin, _ := exec.LookPath("redis-server")
	s.start(bin)
}

// Pause stops the server's process (SIGSTOP): connections stay open and
// calls hang, as with an overloaded or partitioned Redis.
func (s *Server) Pause() { s.binaryOnly("Pause"); s.kill(syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *Server) Resume() { s.binaryOnly("Resume"); s.kill(syscall.SIGCONT) }

func waitClosed(addr string) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}
