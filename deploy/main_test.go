// Package deploy_test checks the files in deploy/ against a real rls: the
// Kubernetes manifests (built with kustomize, decoded strictly into the
// Kubernetes API types, their probes, ports, flags and limits run by a
// started rls), the Prometheus alert rules (parsed as Prometheus parses
// them, and loaded by a real Prometheus that scrapes a started rls and
// fires them) and the Grafana dashboard (every metric they query is one
// that a started rls exports, with the memory store and with Redis).
//
// deploy/ is a Go module of its own, so that rls's module does not carry
// Kubernetes, kustomize and Prometheus; it builds rls from the repository
// (../cmd/rls) and runs it, as the cluster would.
package deploy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rlsBin is the rls binary TestMain builds.
var rlsBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "rls-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	goCmd, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintf(os.Stderr, "building rls: %v (go test puts its own go on PATH)\n", err)
		return 1
	}
	rlsBin = filepath.Join(dir, "rls")
	// From the repository's root: cmd/rls belongs to rls's own module.
	build := exec.Command(goCmd, "build", "-o", rlsBin, "./cmd/rls")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/rls: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// waitLimit bounds every wait for a process to start or stop.
const waitLimit = 15 * time.Second

// proc is a process a test started; t.Cleanup stops it.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // the exit error, once done is closed
}

func startProc(t *testing.T, name string, argv ...string) *proc {
	t.Helper()
	log := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if err := p.stop(); err != nil && !t.Failed() {
			t.Errorf("%s: %v\n%s", name, err, p.output())
		}
	})
	return p
}

// stop sends SIGTERM and waits; past waitLimit it kills the process group.
// It returns the exit error (nil: exit status 0).
func (p *proc) stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(waitLimit):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("did not exit within %v of SIGTERM; killed", waitLimit)
	}
}

func (p *proc) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitFor polls ready until it holds, the process exits, or waitLimit.
func (p *proc) waitFor(ready func() bool) error { return p.waitWithin(waitLimit, ready) }

// waitWithin polls ready until it holds, the process exits, or limit.
func (p *proc) waitWithin(limit time.Duration, ready func() bool) error {
	deadline := time.Now().Add(limit)
	for !ready() {
		if p.exited() {
			return fmt.Errorf("%s exited: %v", p.name, p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: gave up waiting after %v", p.name, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// freeAddr returns a loopback address whose port was free a moment ago,
// drawn below the kernel's ephemeral range as the main module's
// servetest.FreePort draws it (its doc says why; deploy/ is a module of its
// own and cannot import it).
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(10000+rand.IntN(12768)))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// get answers the status and body of a GET.
func get(url string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	return body(c.Get(url))
}

// post answers the status and body of a POST of JSON.
func post(url, json string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	return body(c.Post(url, "application/json", strings.NewReader(json)))
}

func body(resp *http.Response, err error) (int, string, error) {
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// startRLS runs `rls serve args...` and waits until /readyz on httpAddr
// answers 200.
func startRLS(t *testing.T, httpAddr string, args ...string) *proc {
	t.Helper()
	p := startProc(t, "rls", append([]string{rlsBin}, args...)...)
	err := p.waitFor(func() bool {
		code, _, err := get("http://" + httpAddr + "/readyz")
		return err == nil && code == http.StatusOK
	})
	if err != nil {
		t.Fatalf("rls %s: %v\n%s", strings.Join(args, " "), err, p.output())
	}
	return p
}

// startRedis runs redis-server on a free loopback port, nothing persisted.
func startRedis(t *testing.T) string {
	t.Helper()
	addr, _ := startRedisProc(t)
	return addr
}

// startRedisProc is startRedis, with the process, for a test that stops
// Redis itself.
func startRedisProc(t *testing.T) (string, *proc) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: install it (apt-get install -y redis-server); make test does this")
	}
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		p := startProc(t, "redis", bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
		err := p.waitFor(func() bool { return redisPing(addr) == nil })
		if err == nil {
			return addr, p
		}
		if attempt < 3 && strings.Contains(p.output(), "Address already in use") {
			continue
		}
		t.Fatalf("redis-server: %v\n%s", err, p.output())
	}
}

// redisPing sends PING in Redis's inline protocol.
func redisPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return errors.New("PING answered " + strings.TrimSpace(line))
	}
	return nil
}
