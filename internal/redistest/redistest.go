// Package redistest starts real Redis servers for tests: the server binary
// that RLS_TEST_REDIS_SERVER names (Valkey, a Redis built by hand) when it
// is set, else in a container when a Docker engine answers
// (testcontainers-go), otherwise the redis-server binary on a free
// loopback port; and Redis Clusters and
// Sentinel deployments (a master, replicas, sentinels) of redis-server
// processes. Every server is stopped by the test that started
// it. A test that cannot get Redis fails: `make test` installs redis-server.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/testpki"
)

// Server is one Redis server. Its methods may be called from the test's
// goroutine only.
type Server struct {
	addr string
	dir  string
	port int
	args []string
	proc *proctest.Proc // nil in a container
	ctr  testcontainers.Container
	// password and tls are how this server is reached (StartWith).
	password string
	tls      *testpki.PKI
	tb       testing.TB
	mu       sync.Mutex
}

// Addr returns host:port.
func (s *Server) Addr() string { return s.addr }

// URL returns a redis:// URL of database 0.
func (s *Server) URL() string { return "redis://" + s.addr + "/0" }

// Config asks for a server with a password (requirepass) and/or TLS only
// (no plain-text port); such servers always run from the redis-server binary.
type Config struct {
	Password string
	TLS      *testpki.PKI // testpki.New: the server's certificate and CA
	// ClientCerts makes a TLS server require client certificates signed by
	// the PKI's CA (tls-auth-clients yes).
	ClientCerts bool
}

// Start starts a Redis server for the test and stops it when the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb, Config{})
}

// StartWith starts a Redis server configured by c.
func StartWith(tb testing.TB, c Config) *Server {
	tb.Helper()
	plain := c.Password == "" && c.TLS == nil
	if plain && !proctest.RedisNamed() && dockerAnswers() {
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
	bin := serverBinary(tb)
	s := &Server{dir: tb.TempDir(), port: proctest.Port(tb), tb: tb, password: c.Password, tls: c.TLS}
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.args = proctest.RedisArgs(s.port, s.dir)
	if c.Password != "" {
		s.args = append(s.args, "--requirepass", c.Password)
	}
	if c.TLS != nil {
		authClients := "no"
		if c.ClientCerts {
			authClients = "yes"
		}
		s.args = append(s.args, "--port", "0", "--tls-port", strconv.Itoa(s.port), "--tls-cert-file", c.TLS.Cert, "--tls-key-file", c.TLS.Key,
			"--tls-ca-cert-file", c.TLS.CA, "--tls-auth-clients", authClients)
	}
	s.start(bin)
	tb.Cleanup(s.Stop)
	return s
}

// serverBinary returns the server binary the tests start (proctest's
// RedisServer: RLS_TEST_REDIS_SERVER, else redis-server), and logs its
// version line once per test binary, so that a run says what it ran on.
func serverBinary(tb testing.TB) string {
	tb.Helper()
	bin, err := proctest.RedisServer()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	versionOnce.Do(func() {
		v, err := proctest.RedisVersion()
		if err != nil {
			v = err.Error()
		}
		fmt.Fprintf(os.Stderr, "redistest: %s (%s)\n", v, bin)
	})
	return bin
}

// versionOnce logs the server's version once per test binary.
var versionOnce sync.Once

// cliBinary returns the command-line client that goes with the server
// (proctest's RedisCLI).
func cliBinary(tb testing.TB) string {
	tb.Helper()
	cli, err := proctest.RedisCLI()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return cli
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

// start runs redis-server with s.args and waits until it answers PING.
func (s *Server) start(bin string) {
	s.tb.Helper()
	p, err := proctest.Launch(proctest.Options{Name: "redis-server " + s.addr, Log: filepath.Join(s.dir, "redis.log"), Dir: s.dir, StopSignal: syscall.SIGKILL},
		append([]string{bin}, s.args...)...)
	if err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
	s.proc = p
	var last error
	err = p.WaitFor(func() bool {
		last = s.ping()
		return last == nil
	})
	if err != nil {
		p.Stop()
		s.tb.Fatalf("redistest: redis-server on %s: %v (PING: %v)\n%s", s.addr, err, last, p.Output())
	}
}

// ping sends PING, with the server's password and TLS.
func (s *Server) ping() error {
	var out string
	var err error
	if s.tls != nil || s.password != "" {
		out, err = s.secureCommand("PING")
	} else {
		out, err = Command(s.addr, "PING")
	}
	if err == nil && out != "PONG" {
		err = fmt.Errorf("PING answered %q", out)
	}
	return err
}

// secureCommand sends AUTH (when there is a password) and then cmd, over
// TLS when the server has it.
func (s *Server) secureCommand(args ...string) (string, error) {
	var c net.Conn
	var err error
	if s.tls != nil {
		// The PKI's certificate, for a server that requires one.
		cert, err := tls.LoadX509KeyPair(s.tls.Cert, s.tls.Key)
		if err != nil {
			return "", err
		}
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.addr, &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}})
		if err != nil {
			return "", err
		}
	} else {
		c, err = net.DialTimeout("tcp", s.addr, time.Second)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if s.password != "" {
		c.Write(encode("AUTH", s.password))
		if _, err := readReply(r); err != nil {
			return "", err
		}
	}
	c.Write(encode(args...))
	return readReply(r)
}

func encode(args ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(b.String())
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
	if _, err := c.Write(encode(args...)); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

// Counters returns, sorted, the counters that rls keeps under prefix on a
// Redis that do asks (Command on an address, or a Server's Do), each by
// its key (engine.CounterKey): a sliding log's sorted set, and each field
// of a descriptor's hash but its expiry. Keys under prefix that hold no
// counter (the board the processes publish on, <prefix>board:...) are left
// out: a counter's key has the descriptor's identity in braces right
// after the prefix.
func Counters(do func(args ...string) (string, error), prefix string) ([]string, error) {
	out, err := do("KEYS", prefix+"{*")
	if err != nil {
		return nil, err
	}
	var counters []string
	for _, key := range strings.Fields(out) {
		typ, err := do("TYPE", key)
		if err != nil {
			return nil, err
		}
		if typ != "hash" {
			counters = append(counters, key)
			continue
		}
		fields, err := do("HKEYS", key)
		if err != nil {
			return nil, err
		}
		for _, f := range strings.Fields(fields) {
			if f != engine.HashExpiry {
				counters = append(counters, engine.CounterKeyIn(key, f))
			}
		}
	}
	slices.Sort(counters)
	return counters, nil
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

func (s *Server) binaryOnly(what string) {
	s.tb.Helper()
	if s.proc == nil {
		s.tb.Fatalf("redistest: %s needs a redis-server process (not a container)", what)
	}
}

// Stop kills the server (its whole process group, a paused one too) and
// waits until its port is closed. Idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctr != nil {
		testcontainers.TerminateContainer(s.ctr)
		return
	}
	s.proc.Stop()
	// A child that redis-server forked (a snapshot for a replica) holds
	// the listening socket until the kill reaches it too.
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
	s.start(serverBinary(s.tb))
}

// Pause stops the server's process (SIGSTOP): connections stay open and
// calls hang, as with an overloaded or partitioned Redis. It returns once
// every thread of the process has stopped (kill(2) returns before that).
func (s *Server) Pause() {
	s.tb.Helper()
	s.binaryOnly("Pause")
	if err := s.proc.Signal(syscall.SIGSTOP); err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
}

// Resume continues a paused server.
func (s *Server) Resume() {
	s.tb.Helper()
	s.binaryOnly("Resume")
	if err := s.proc.Signal(syscall.SIGCONT); err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
}

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
