package proctest

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the child process of these tests: with
// PROCTEST_CHILD=1 in its environment, TestMain does what its arguments say
// instead of running tests.
//
//	serve ADDR     answer every HTTP request 200 on ADDR until SIGTERM, then exit 0
//	fail-in-use    print "bind: address already in use" and exit 1
//	exit N         exit with status N
//	rls            find or build the rls binary; print "built PATH" or "found PATH"
const childEnv = "PROCTEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(child(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func child(args []string) int {
	switch {
	case len(args) == 2 && args[0] == "serve":
		l, err := net.Listen("tcp", args[1])
		if err != nil {
			fmt.Println(err)
			return 1
		}
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}
		go srv.Serve(l)
		fmt.Println("serving on", args[1])
		<-term
		srv.Close()
		return 0
	case len(args) == 1 && args[0] == "fail-in-use":
		fmt.Println("listen tcp: bind: address already in use")
		return 1
	case len(args) == 2 && args[0] == "exit":
		var n int
		fmt.Sscan(args[1], &n)
		return n
	case len(args) == 1 && args[0] == "rls":
		bin, built, err := findOrBuild()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		fmt.Println(map[bool]string{true: "built", false: "found"}[built], bin)
		return 0
	}
	fmt.Println("unknown child command", args)
	return 2
}

// childOptions run this test binary as a child (argv: childArgv(what...)).
func childOptions() Options {
	return Options{Name: "child", Env: append(os.Environ(), childEnv+"=1")}
}

func childArgv(t *testing.T, what ...string) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{exe}, what...)
}

// alive reports whether process pid runs (a zombie does not: it waits for
// its parent to reap it).
func alive(pid int) bool {
	f, err := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && f[0] != "Z"
}

// recorder is a testing.TB that records failures instead of failing, for
// the tests of what Start's cleanup reports.
type recorder struct {
	testing.TB
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Logf(string, ...any) {}
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs) > 0
}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// end runs the cleanups, last first, as the end of a test does.
func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestStartStopsAtCleanupAndChecksExit(t *testing.T) {
	addr := Addr(t)
	rec := &recorder{TB: t}
	p := Start(rec, childOptions(), childArgv(t, "serve", addr)...)
	if err := p.WaitFor(HTTPOK("http://" + addr + "/")); err != nil {
		t.Fatalf("WaitFor(HTTPOK): %v\n%s", err, p.Output())
	}
	if !strings.Contains(p.Output(), "serving on "+addr) {
		t.Errorf("Output() = %q, want the child's line", p.Output())
	}
	rec.end()
	if !p.Exited() {
		t.Fatalf("the child runs after the test's cleanup")
	}
	if len(rec.errs) > 0 {
		t.Errorf("cleanup of a child that exits 0 on SIGTERM reported %q", rec.errs)
	}

	// A child that died with an error on its own, unnoticed by the test:
	// the cleanup reports it, with its output.
	rec = &recorder{TB: t}
	p = Start(rec, childOptions(), childArgv(t, "exit", "3")...)
	<-p.done
	rec.end()
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "exit status 3") {
		t.Errorf("cleanup of a child that exited 3 reported %q, want one error naming exit status 3", rec.errs)
	}

	// The same, stopped by the test, which checked the result itself.
	rec = &recorder{TB: t}
	p = Start(rec, childOptions(), childArgv(t, "exit", "3")...)
	<-p.done
	if err := p.Stop(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Stop() = %v, want exit status 3", err)
	}
	rec.end()
	if len(rec.errs) > 0 {
		t.Errorf("cleanup after the test's own Stop reported %q", rec.errs)
	}
}

func TestStopKillsTheGroup(t *testing.T) {
	// A shell whose child ignores SIGTERM and stays in the group, as an
	// nginx worker might outlive its master.
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := Start(t, Options{}, "sh", "-c", `sh -c 'trap "" TERM; echo $$ > `+pidFile+`; while :; do sleep 1; done' & wait`)
	var pid int
	if err := p.WaitFor(func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		_, err = fmt.Sscan(string(b), &pid)
		return err == nil
	}); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	deadline := time.Now().Add(WaitLimit)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d of the group still runs after Stop", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSignalStopWaitsUntilFrozen(t *testing.T) {
	addr := Addr(t)
	p := Start(t, childOptions(), childArgv(t, "serve", addr)...)
	if err := p.WaitFor(Listening(addr)); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS == "linux" { // elsewhere no /proc tells the state
		f, err := statFields(fmt.Sprintf("/proc/%d/stat", p.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		if f[0] != "T" && f[0] != "t" {
			t.Errorf("state after Signal(SIGSTOP) = %s, want T", f[0])
		}
	}
	// Stop thaws it first: a frozen process would never act on SIGTERM.
	if err := p.Stop(); err != nil {
		t.Errorf("Stop() of a frozen child = %v, want nil", err)
	}
}

func TestWaitForReportsAnExit(t *testing.T) {
	p := Start(t, childOptions(), childArgv(t, "exit", "4")...)
	err := p.WaitFor(func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "child exited: exit status 4") {
		t.Errorf("WaitFor on a child that exits = %v, want it to say it exited with status 4", err)
	}
	p.Stop()
}

func TestStartListeningTriesAgainWhenTheAddressIsTaken(t *testing.T) {
	var tries []string
	p, addr := StartListening(t, childOptions(), func(addr string) []string {
		tries = append(tries, addr)
		if len(tries) == 1 {
			return childArgv(t, "fail-in-use")
		}
		return childArgv(t, "serve", addr)
	}, func(addr string) func() bool { return HTTPOK("http://" + addr + "/") })
	if len(tries) != 2 || tries[1] != addr {
		t.Errorf("tries %v, returned %s; want a second try, on the address returned", tries, addr)
	}
	if !HTTPOK("http://"+addr+"/")() || p.Exited() {
		t.Errorf("the second child does not answer on %s", addr)
	}
}

func TestFreePortBelowTheEphemeralRange(t *testing.T) {
	for range 20 {
		if p := Port(t); p < firstPort || p >= endPorts {
			t.Errorf("Port() = %d, want one in [%d, %d)", p, firstPort, endPorts)
		}
	}
}

func TestRedisArgsLaterWins(t *testing.T) {
	args := RedisArgs(12345, "/tmp/x", "--appendonly", "yes")
	want := []string{"--port", "12345", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", "/tmp/x", "--appendonly", "yes"}
	if fmt.Sprintf("%q", args) != fmt.Sprintf("%q", want) {
		t.Errorf("RedisArgs = %q, want %q", args, want)
	}
}

func TestStartRedis(t *testing.T) {
	addr, p := StartRedis(t)
	if !RedisPONG(addr)() {
		t.Fatalf("no PONG from %s", addr)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("redis-server after SIGTERM: %v", err)
	}
	if RedisPONG(addr)() {
		t.Errorf("PONG from %s after Stop", addr)
	}
}

func TestCPUTime(t *testing.T) {
	if runtime.GOOS != "linux" {
		if got := CPUTime(os.Getpid()); got != 0 {
			t.Errorf("CPUTime without /proc = %v, want 0", got)
		}
		return
	}
	start := CPUTime(os.Getpid())
	for deadline := time.Now().Add(5 * time.Second); CPUTime(os.Getpid()) <= start; {
		if time.Now().After(deadline) {
			t.Fatalf("CPUTime(self) stayed at %v while spinning", start)
		}
	}
	if CPUTime(-1) != 0 {
		t.Errorf("CPUTime of no process = %v, want 0", CPUTime(-1))
	}
}

func TestIOCalls(t *testing.T) {
	if runtime.GOOS != "linux" {
		if r, w := IOCalls(os.Getpid()); r != 0 || w != 0 {
			t.Errorf("IOCalls without /proc = %d, %d, want 0, 0", r, w)
		}
		return
	}
	r0, w0 := IOCalls(os.Getpid())
	f, err := os.Create(filepath.Join(t.TempDir(), "calls"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 10 {
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(make([]byte, 1), 0); err != nil {
			t.Fatal(err)
		}
	}
	// The test's other goroutines may make calls of their own: at least.
	if r, w := IOCalls(os.Getpid()); r-r0 < 10 || w-w0 < 10 {
		t.Errorf("IOCalls after 10 reads and 10 writes: %d reads, %d writes more, want at least 10 each", r-r0, w-w0)
	}
	if r, w := IOCalls(-1); r != 0 || w != 0 {
		t.Errorf("IOCalls of no process = %d, %d, want 0, 0", r, w)
	}
}

// writeModule lays out a module of rls's path in a directory: cmd/rls with
// an embedded file and a test, another package, a README.
func writeModule(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":                 "module " + module + "\n\ngo 1.22\n",
		"go.sum":                 "",
		"README.md":              "the docs\n",
		"cmd/rls/main.go":        "package main\n\nimport (\n\t_ \"embed\"\n\n\t\"" + module + "/internal/lib\"\n)\n\n//go:embed script.lua\nvar script string\n\nfunc main() { println(script, lib.X) }\n",
		"cmd/rls/script.lua":     "return 1\n",
		"cmd/rls/main_test.go":   "package main\n",
		"internal/lib/lib.go":    "package lib\n\nconst X = 1\n",
		"internal/other/y.go":    "package other\n",
		"cmd/rls/ignored_foo.go": "//go:build ignore\n\npackage main\n",
	}
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSourceKey: the key of the binary changes with what the build reads
// (a Go file of cmd/rls or of a package it imports, an embedded file,
// go.mod) and with nothing else (tests, other packages, docs, files a
// build tag leaves out).
func TestSourceKey(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	root := writeModule(t)
	key := func() string {
		t.Helper()
		k, err := sourceKey(goCmd, root)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k0 := key()
	for _, tc := range []struct {
		file    string
		changes bool
	}{
		{"cmd/rls/main_test.go", false},
		{"internal/other/y.go", false},
		{"README.md", false},
		{"cmd/rls/ignored_foo.go", false},
		{"cmd/rls/script.lua", true},
		{"internal/lib/lib.go", true},
		{"cmd/rls/main.go", true},
		{"go.mod", true},
	} {
		path := filepath.Join(root, tc.file)
		old, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(old, "\n// edited\n"...), 0o644); err != nil {
			t.Fatal(err)
		}
		if k := key(); (k != k0) != tc.changes {
			t.Errorf("after an edit of %s: key changed = %v, want %v", tc.file, k != k0, tc.changes)
		}
		if err := os.WriteFile(path, old, 0o644); err != nil {
			t.Fatal(err)
		}
		if k := key(); k != k0 {
			t.Errorf("%s restored: key %s, want the first %s", tc.file, k, k0)
		}
	}
}

// TestLockMakesOthersWait: while one holder has the lock, another waits,
// and gets it once it is released; a bounded wait gives up with a message.
func TestLockMakesOthersWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := lock(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock(path, 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "another process has been building rls") {
		t.Errorf("second lock while held = %v, want it to give up naming the holder", err)
	}
	got := make(chan error, 1)
	go func() {
		u, err := lock(path, WaitLimit)
		if err == nil {
			u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second lock returned %v while the first was held", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	if err := <-got; err != nil {
		t.Errorf("second lock after the release = %v", err)
	}
}

func TestPruneKeepsTheRecent(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	age := map[string]time.Duration{
		"rls-a": 3 * time.Hour, "rls-b": 4 * time.Hour, "rls-c": 5 * time.Hour, "rls-d": 6 * time.Hour,
		"rls-e": 10 * time.Minute, "rls-f": 7 * time.Hour, "rls-f.lock": 7 * time.Hour,
		"rls-g.tmp123": 2 * time.Hour, "rls-h.tmp456": time.Minute, "rls-keep": 9 * time.Hour,
	}
	for name, a := range age {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, now.Add(-a), now.Add(-a)); err != nil {
			t.Fatal(err)
		}
	}
	prune(dir, filepath.Join(dir, "rls-keep"))
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	// e a b (the three last used, e also within the hour), keep (asked
	// for), h (a build under way); not c d f (older), nor f's lock, nor g
	// (a build that died).
	want := "rls-a rls-b rls-e rls-h.tmp456 rls-keep"
	if got := strings.Join(left, " "); got != want {
		t.Errorf("after prune: %s, want %s", got, want)
	}
}

// TestRLS: the binary runs, and two processes that ask for it at the same
// time with an empty cache get the same file, built by one of them while
// the other waits (the test packages of a run ask side by side).
func TestRLS(t *testing.T) {
	bin := RLSBinary(t)
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "rls ") {
		t.Fatalf("%s version = %q, %v; want rls ...", bin, out, err)
	}

	// An empty cache of binaries (os.UserCacheDir is XDG_CACHE_HOME on
	// Linux), Go's build cache as it is (it would move with
	// XDG_CACHE_HOME): the children link, they do not compile everything.
	goCache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	o := childOptions()
	cache := t.TempDir()
	o.Env = append(o.Env, "XDG_CACHE_HOME="+cache, "GOCACHE="+strings.TrimSpace(string(goCache)))
	var ps []*Proc
	for range 2 {
		ps = append(ps, Start(t, o, childArgv(t, "rls")...))
	}
	var got []string
	for _, p := range ps {
		if err := p.WaitWithin(buildWait, p.Exited); err != nil {
			t.Fatal(err)
		}
		if err := p.Stop(); err != nil {
			t.Fatalf("%v\n%s", err, p.Output())
		}
		got = append(got, strings.TrimSpace(p.Output()))
	}
	want := filepath.Join(cache, "rls-proctest", filepath.Base(bin))
	built := map[string]int{}
	for _, line := range got {
		verb, path, _ := strings.Cut(line, " ")
		built[verb]++
		if path != want {
			t.Errorf("a child got %s, want %s", path, want)
		}
	}
	if built["built"] != 1 || built["found"] != 1 {
		t.Errorf("children said %q, want one built and one found", got)
	}
}
