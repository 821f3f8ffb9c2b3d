// Package redistest starts real Redis servers for tests: a redis:7 container
// when a Docker engine answers (testcontainers-go), otherwise the redis-server
// binary on a free 127.0.0.1 port, and Redis Clusters of redis-server
// processes. Every server is stopped by the test that started it, and a test
// that cannot get a Redis fails (it never skips): `make test` installs
// redis-server.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
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

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// InstallHint is how to get redis-server; failures that need it say so.
const InstallHint = "apt-get install -y redis-server"

const (
	startTimeout = 10 * time.Second // until a new server answers PING
	stopTimeout  = 10 * time.Second // until a killed server is gone
)

// Option configures Start.
type Option func(*config)

type config struct {
	password string
	tls      *TLSFiles
	binary   bool
}

// WithPassword starts a server that requires this password (requirepass).
// Such a server always runs from the redis-server binary.
func WithPassword(p string) Option { return func(c *config) { c.password = p } }

// WithTLS starts a server that speaks TLS only, with these files (the
// plain-text port is off). Such a server always runs from the redis-server
// binary.
func WithTLS(f *TLSFiles) Option { return func(c *config) { c.tls = f } }

// Binary starts the redis-server binary even when a Docker engine answers:
// Pause and Resume need a process of their own.
func Binary() Option { return func(c *config) { c.binary = true } }

// Server is one Redis server started for a test. Its methods are safe for
// concurrent use; Stop (which the test's cleanup also calls) is idempotent.
type Server struct {
	tb   testing.TB
	cfg  config
	addr string // host:port
	port int
	dir  string   // binary mode: working directory and log
	args []string // binary mode: redis-server arguments

	mu      sync.Mutex
	proc    *process                 // binary mode: the running process, nil when killed; guarded by mu
	ctr     testcontainers.Container // container mode, until Stop; guarded by mu
	running bool                     // container mode: started and not killed; guarded by mu
	stopped bool                     // Stop was called; guarded by mu
}

// process is one running redis-server; done is closed when it has exited
// and been reaped.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.addr }

// URL returns a redis:// URL of the server's database 0 (with the password
// when there is one; rediss:// for a TLS server).
func (s *Server) URL() string {
	scheme := "redis://"
	if s.cfg.tls != nil {
		scheme = "rediss://"
	}
	auth := ""
	if s.cfg.password != "" {
		auth = ":" + s.cfg.password + "@"
	}
	return scheme + auth + s.addr + "/0"
}

// Start starts a Redis server for the test and stops it when the test ends:
// a redis:7 container when a Docker engine answers (checked once per test
// binary, in at most about a second), else redis-server from PATH on a free
// 127.0.0.1 port, without persistence, in a temporary directory. If neither
// is available the test fails with the command that installs redis-server.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s := &Server{tb: tb}
	for _, o := range opts {
		o(&s.cfg)
	}
	tb.Cleanup(s.Stop)
	if !s.cfg.binary && s.cfg.password == "" && s.cfg.tls == nil && DockerAnswers() {
		err := s.startContainer()
		if err == nil {
			return s
		}
		tb.Logf("redistest: a Docker engine answers but the redis:7 container failed (%v); trying redis-server", err)
	}
	bin := serverBinary(tb)
	s.dir = tb.TempDir()
	var err error
	for range 3 { // a free port may be taken before redis-server binds it
		s.port = freePort(tb)
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		s.args = s.serverArgs()
		if err = s.spawn(bin); err == nil {
			return s
		}
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	tb.Fatalf("redistest: %v", err)
	return nil
}

func (s *Server) serverArgs() []string {
	port := strconv.Itoa(s.port)
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.dir}
	if s.cfg.password != "" {
		args = append(args, "--requirepass", s.cfg.password)
	}
	if f := s.cfg.tls; f != nil {
		args[1] = "0" // no plain-text port
		args = append(args, "--tls-port", port, "--tls-cert-file", f.Cert, "--tls-key-file", f.Key,
			"--tls-ca-cert-file", f.CA, "--tls-auth-clients", "no")
	}
	return args
}

// serverBinary returns the path of redis-server, or fails the test with the
// install command.
func serverBinary(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redistest: no Docker engine answers and redis-server is not in PATH; install it: %s", InstallHint)
	}
	return bin
}

var docker struct {
	once sync.Once
	ok   bool
}

// DockerAnswers reports whether a Docker engine answers, as testcontainers
// finds it (DOCKER_HOST, Docker contexts, ~/.testcontainers.properties). The
// first call costs at most about a second when there is none; the answer is
// remembered for the test binary.
func DockerAnswers() bool {
	docker.once.Do(func() {
		answer := make(chan bool, 1)
		go func() { // exits when the probe returns, bounded by its context
			ctx, cancel := context.WithTimeout(context.Background(), 900*time.Millisecond)
			defer cancel()
			p, err := testcontainers.NewDockerProvider()
			answer <- err == nil && p.Health(ctx) == nil // Health closes p
		}()
		select {
		case docker.ok = <-answer:
		case <-time.After(time.Second):
		}
	})
	return docker.ok
}

// startContainer runs redis:7 with its port published on a fixed host port,
// so that Restart keeps the address.
func (s *Server) startContainer() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.port = freePort(s.tb)
	port := network.MustParsePort("6379/tcp")
	ctr, err := tcredis.Run(ctx, "redis:7",
		testcontainers.WithCmdArgs("--save", "", "--appendonly", "no"),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.PortBindings = network.PortMap{port: {{HostPort: strconv.Itoa(s.port)}}}
		}))
	if err != nil {
		if ctr != nil {
			testcontainers.TerminateContainer(ctr)
		}
		return err
	}
	host, err := ctr.Host(ctx)
	if err != nil {
		testcontainers.TerminateContainer(ctr)
		return err
	}
	s.addr = net.JoinHostPort(host, strconv.Itoa(s.port))
	s.mu.Lock()
	s.ctr, s.running = ctr, true
	s.mu.Unlock()
	return s.waitPing(startTimeout)
}

// spawn starts redis-server with s.args and waits until it answers PING.
func (s *Server) spawn(bin string) error {
	p, err := startProcess(bin, s.dir, s.args)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if err := s.waitPing(startTimeout); err != nil {
		p.kill()
		return fmt.Errorf("redis-server on %s: %w\n%s", s.addr, err, s.LogTail())
	}
	return nil
}

func startProcess(bin, dir string, args []string) (*process, error) {
	out, err := os.OpenFile(filepath.Join(dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { // exits when the process does; every path kills it
		cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process unless it has exited (its pid may then
// belong to another process).
func (p *process) signal(sig syscall.Signal) {
	if !p.exited() {
		syscall.Kill(p.cmd.Process.Pid, sig)
	}
}

// kill kills the process and waits until it is gone.
func (p *process) kill() {
	p.signal(syscall.SIGKILL)
	p.signal(syscall.SIGCONT) // a stopped process dies only once continued
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
	}
}

// waitPing waits, within d, until the server answers PING.
func (s *Server) waitPing(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		s.mu.Lock()
		p := s.proc
		s.mu.Unlock()
		if p != nil && p.exited() {
			return errors.New("redis-server exited")
		}
		out, err := s.Do("PING")
		if err == nil && out == "PONG" {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("PING answered %q", out)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %s: %w", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Do sends one command to the server, with AUTH first when it has a
// password and over TLS when it speaks TLS, and returns the reply as Command
// does.
func (s *Server) Do(args ...string) (string, error) {
	var c net.Conn
	var err error
	if s.cfg.tls != nil {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.addr, &tls.Config{InsecureSkipVerify: true})
	} else {
		c, err = net.DialTimeout("tcp", s.addr, time.Second)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if s.cfg.password != "" {
		if _, err := c.Write(encode("AUTH", s.cfg.password)); err != nil {
			return "", err
		}
		if _, err := readReply(r); err != nil {
			return "", err
		}
	}
	if _, err := c.Write(encode(args...)); err != nil {
		return "", err
	}
	return readReply(r)
}

// Stop stops the server (SIGKILL, or the container's removal) and waits
// until it is gone. It is idempotent; the test's cleanup calls it.
func (s *Server) Stop() {
	s.mu.Lock()
	p, ctr := s.proc, s.ctr
	if s.stopped {
		p, ctr = nil, nil
	}
	s.proc, s.ctr, s.running, s.stopped = nil, nil, false, true
	s.mu.Unlock()
	if p != nil {
		p.kill()
	}
	if ctr != nil {
		testcontainers.TerminateContainer(ctr)
	}
}

// Kill kills the server abruptly (SIGKILL), as a crash would, and waits
// until it is gone; Restart brings it back.
func (s *Server) Kill() {
	s.tb.Helper()
	s.mu.Lock()
	p, ctr := s.proc, s.ctr
	if !s.running {
		ctr = nil
	}
	s.proc, s.running = nil, false
	s.mu.Unlock()
	if p != nil {
		p.kill()
	}
	if ctr != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		zero := time.Duration(0)
		if err := ctr.Stop(ctx, &zero); err != nil {
			s.tb.Fatalf("redistest: killing the container: %v", err)
		}
	}
}

// Restart kills the server if it runs and starts an empty one on the same
// address (a container keeps its published port).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	s.mu.Lock()
	ctr, stopped := s.ctr, s.stopped
	s.mu.Unlock()
	switch {
	case stopped:
		s.tb.Fatal("redistest: Restart after Stop")
	case ctr != nil:
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := ctr.Start(ctx); err != nil {
			s.tb.Fatalf("redistest: restarting the container: %v", err)
		}
		s.mu.Lock()
		s.running = true
		s.mu.Unlock()
		if err := s.waitPing(startTimeout); err != nil {
			s.tb.Fatalf("redistest: restarted container: %v", err)
		}
	default:
		if err := s.spawn(serverBinary(s.tb)); err != nil {
			s.tb.Fatalf("redistest: restart: %v", err)
		}
	}
}

// Pause stops the server's process (SIGSTOP): connections stay open and
// commands hang, as with an overloaded or partitioned Redis. Binary mode
// only (start with Binary() where Docker may answer).
func (s *Server) Pause() { s.signal("Pause", syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT). Binary mode only.
func (s *Server) Resume() { s.signal("Resume", syscall.SIGCONT) }

func (s *Server) signal(what string, sig syscall.Signal) {
	s.tb.Helper()
	s.mu.Lock()
	p, ctr := s.proc, s.ctr
	s.mu.Unlock()
	if ctr != nil {
		s.tb.Fatalf("redistest: %s needs a redis-server process; start the server with redistest.Binary()", what)
	}
	if p != nil {
		p.signal(sig)
	}
}

// LogTail returns the end of the server's log (binary mode), for failure
// messages.
func (s *Server) LogTail() string {
	if s.dir == "" {
		return "(no log: container)"
	}
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return fmt.Sprintf("--- redis-server %s ---\n%s", s.addr, b)
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Command sends one command to a server without password or TLS and returns
// its reply rendered as text: simple and bulk strings as they are, integers
// in decimal, a nil bulk string as "", arrays one element per line. An error
// reply is returned as an error.
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

func encode(args ...string) []byte {
	var b []byte
	b = fmt.Appendf(b, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, max(n, 0))
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
