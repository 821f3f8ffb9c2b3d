// Package procs runs the programs that the benchmark commands measure: it
// builds rls, starts and stops child processes with their process groups,
// finds free loopback addresses, waits for servers and reads their
// Prometheus metrics. It knows nothing of what is measured.
package procs

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BuildRLS builds ./cmd/rls into dir and returns the binary's path.
func BuildRLS(dir string) (string, error) {
	bin := filepath.Join(dir, "rls")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/rls")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building rls: %w", err)
	}
	return bin, nil
}

// Proc is a child process, stopped with its process group.
type Proc struct {
	name string
	cmd  *exec.Cmd
}

// Start starts bin with args; its output goes to stderr.
func Start(name, bin string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return &Proc{name: name, cmd: cmd}, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM to the process group, and SIGKILL after 5s.
func (p *Proc) Stop() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// WaitTCP waits up to 15s until addr accepts connections.
func WaitTCP(addr string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New(addr + " did not accept connections within 15s")
}

// WaitHTTP waits up to 15s until url answers 200.
func WaitHTTP(url string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within 15s", url)
}

// Scrape reads the unlabelled samples of a Prometheus text page.
func Scrape(url string) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get(url)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// CPUTime returns the CPU time (user + system) that process pid has used,
// read from /proc (Linux); 0 where /proc cannot tell.
func CPUTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start with field 3 (state). utime and stime are
	// fields 14 and 15, in clock ticks (USER_HZ, 100 on Linux).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(utime+stime) * (time.Second / 100)
}
