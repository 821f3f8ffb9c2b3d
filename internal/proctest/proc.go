package proctest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// WaitLimit bounds every wait of this package for a process: to be ready
// (WaitFor), to exit after its stop signal (Stop), to freeze (Signal with
// SIGSTOP). The bound only keeps a broken test from hanging; it is not a
// measure of time.
const WaitLimit = 15 * time.Second

// Options say how to run a child process. The zero value runs it in the
// current directory with the current environment, its output on stderr,
// stopped with SIGTERM.
type Options struct {
	// Name names the process in messages; default the base name of the
	// program.
	Name string
	// Log is the file that gets the process's stdout and stderr, which
	// Output reads back. Empty: Launch sends the output to this process's
	// stderr (a benchmark's choice), Start to a file in the test's TempDir.
	Log string
	// ExtraLogs are more files that Output shows after the log (nginx's
	// access log, say).
	ExtraLogs []string
	// Dir is the working directory; empty: the current one.
	Dir string
	// Env is the environment; nil: the current one.
	Env []string
	// StopSignal is what Stop sends to end the process; 0 means SIGTERM.
	// With SIGKILL the whole process group gets it and the exit status is
	// not asked for (a killed process has none worth checking).
	StopSignal syscall.Signal
}

// Proc is a running child process, in a process group of its own. Its
// methods are safe for concurrent use.
type Proc struct {
	name    string
	opts    Options
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	waitErr error         // set before done is closed

	stopOnce sync.Once
	stopErr  error
	mu       sync.Mutex
	stopped  bool // Stop was called by the test, which then checks the result itself
}

// Launch starts argv[0] with the arguments argv[1:] as o says. The caller
// stops it (Stop) on every path; a test uses Start, which does that itself.
func Launch(o Options, argv ...string) (*Proc, error) {
	if len(argv) == 0 {
		return nil, errors.New("proctest: no program to start")
	}
	if o.Name == "" {
		o.Name = filepath.Base(argv[0])
	}
	if o.StopSignal == 0 {
		o.StopSignal = syscall.SIGTERM
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = o.Dir, o.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if o.Log == "" {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	} else {
		f, err := os.Create(o.Log)
		if err != nil {
			return nil, fmt.Errorf("starting %s: %w", o.Name, err)
		}
		defer f.Close() // the child holds its own descriptor
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", o.Name, err)
	}
	p := &Proc{name: o.Name, opts: o, cmd: cmd, done: make(chan struct{})}
	// Owned by the process: it ends when the process exits, which Stop
	// brings about.
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Start is Launch for a test: it fails the test when the process cannot
// start, and stops it when the test ends. If the test did not call Stop
// itself, a stop that fails (the process exited on its own with an error, or
// did not exit within WaitLimit of its stop signal) fails the test; and when
// the test has failed, the end of the process's output is logged.
func Start(tb testing.TB, o Options, argv ...string) *Proc {
	tb.Helper()
	if o.Log == "" {
		name := o.Name
		if name == "" && len(argv) > 0 {
			name = filepath.Base(argv[0])
		}
		o.Log = filepath.Join(tb.TempDir(), name+".log")
	}
	p, err := Launch(o, argv...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		p.mu.Lock()
		checked := p.stopped
		p.mu.Unlock()
		if err := p.Stop(); err != nil && !checked && !tb.Failed() {
			tb.Errorf("%s: %v\n%s", p.name, err, p.Output())
			return
		}
		if tb.Failed() {
			tb.Logf("%s output:\n%s", p.name, tail(p.Output(), 16<<10))
		}
	})
	return p
}

// tail is the last n bytes of s, saying how much it left out.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("[%d bytes before]\n%s", len(s)-n, s[len(s)-n:])
}

// Name is the name in messages.
func (p *Proc) Name() string { return p.name }

// Pid is the process id, also the id of its process group.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process: SIGCONT to its group (a frozen process cannot act
// on a signal), the stop signal, then a wait; past WaitLimit it kills the
// group. Then it kills any member of the group left behind (nginx workers
// whose master died). It returns the exit error: nil for exit status 0,
// and always nil for a process stopped with SIGKILL; an error too when the
// process had to be killed. Later calls return the first result.
func (p *Proc) Stop() error {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.stopOnce.Do(func() {
		pgid := p.cmd.Process.Pid
		sig := p.opts.StopSignal
		if !p.Exited() {
			syscall.Kill(-pgid, syscall.SIGCONT)
			if sig == syscall.SIGKILL {
				syscall.Kill(-pgid, syscall.SIGKILL)
			} else {
				p.cmd.Process.Signal(sig)
			}
			select {
			case <-p.done:
			case <-time.After(WaitLimit):
				syscall.Kill(-pgid, syscall.SIGKILL)
				<-p.done
				p.stopErr = fmt.Errorf("did not exit within %v of %v; killed", WaitLimit, sig)
			}
		}
		if syscall.Kill(-pgid, 0) == nil {
			syscall.Kill(-pgid, syscall.SIGKILL)
		}
		if p.stopErr == nil && sig != syscall.SIGKILL && p.waitErr != nil {
			p.stopErr = fmt.Errorf("stopped with %v: %w, want exit status 0", sig, p.waitErr)
		}
	})
	return p.stopErr
}

// Signal sends sig to the process. For SIGSTOP it returns once every thread
// of the process has stopped: kill(2) returns before that, and on a busy
// machine a thread on another CPU could still answer a request.
func (p *Proc) Signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: %v: %w", p.name, sig, err)
	}
	if sig == syscall.SIGSTOP {
		return p.waitFrozen()
	}
	return nil
}

// waitFrozen waits until every thread of the process is stopped (state T
// or t in /proc), within WaitLimit. Where /proc cannot tell (not Linux) it
// returns at once.
func (p *Proc) waitFrozen() error {
	dir := fmt.Sprintf("/proc/%d/task", p.Pid())
	deadline := time.Now().Add(WaitLimit)
	for {
		tasks, err := os.ReadDir(dir)
		if err != nil {
			return nil
		}
		running := 0
		for _, task := range tasks {
			f, err := statFields(filepath.Join(dir, task.Name(), "stat"))
			if err != nil {
				continue // the thread exited
			}
			if f[0] != "T" && f[0] != "t" {
				running++
			}
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d threads still running %v after SIGSTOP", p.name, running, WaitLimit)
		}
		time.Sleep(time.Millisecond)
	}
}

// statFields reads a /proc stat file and returns its fields from the third
// (the state) on: the command name before them may hold spaces.
func statFields(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("%s: no command name in %q", path, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) == 0 {
		return nil, fmt.Errorf("%s: no fields after the command name", path)
	}
	return f, nil
}

// Output returns what the process has written so far, then the extra logs,
// each under a line naming it. It is empty when the output goes to stderr.
func (p *Proc) Output() string {
	if p.opts.Log == "" {
		return ""
	}
	b, _ := os.ReadFile(p.opts.Log)
	s := string(b)
	for _, extra := range p.opts.ExtraLogs {
		if b, err := os.ReadFile(extra); err == nil {
			s += "--- " + filepath.Base(extra) + "\n" + string(b)
		}
	}
	return s
}

// WaitFor polls ready every 20 ms until it holds, and fails when the
// process exits first or after WaitLimit.
func (p *Proc) WaitFor(ready func() bool) error { return p.WaitWithin(WaitLimit, ready) }

// WaitWithin is WaitFor with another bound, for an event that takes longer
// than a start (an alert that fires after its rule's for: duration).
func (p *Proc) WaitWithin(limit time.Duration, ready func() bool) error {
	deadline := time.Now().Add(limit)
	for !ready() {
		if p.Exited() {
			return fmt.Errorf("%s exited: %v", p.name, p.waitErr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not ready after %v", p.name, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// IOCalls returns the read and write system calls that process pid has
// made (/proc/<pid>/io's syscr and syscw: read, recvmsg, write, sendmsg
// and the like), read from /proc (Linux); 0, 0 where /proc cannot tell.
func IOCalls(pid int) (reads, writes int64) {
	if pid <= 0 {
		return 0, 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, _ := strings.Cut(line, ": ")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// CPUTime returns the CPU time (user and system) that process pid has used,
// read from /proc (Linux); 0 where /proc cannot tell.
func CPUTime(pid int) time.Duration {
	f, err := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	// utime and stime are fields 14 and 15 of the file (12 and 13 here),
	// in clock ticks (USER_HZ, 100 on Linux).
	if err != nil || len(f) < 13 {
		return 0
	}
	var ticks int64
	for _, s := range f[11:13] {
		var n int64
		if _, err := fmt.Sscan(s, &n); err != nil {
			return 0
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100)
}
