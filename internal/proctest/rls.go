package proctest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// module is the import path of rls's module, whose cmd/rls RLS builds.
const module = "github.com/rlsproject/rls"

// cgoOff and buildArgs are how RLS builds: as `make build` compiles
// (CGO_ENABLED=0, -trimpath, -s -w), so that the compiled packages in Go's
// build cache serve both, and `make build` after a test run only links.
// `make build` adds the version (-X main.buildVersion), which no test reads.
const cgoOff = "CGO_ENABLED=0"

func buildArgs(out string) []string {
	return []string{"build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/rls"}
}

// buildWait bounds the wait for another process's build of the same
// sources (a first build compiles about 400 packages: minutes on two
// cores) and for a build itself.
const buildWait = 10 * time.Minute

// rlsOnce memoizes RLS in a process: the answer cannot change while it runs
// (a test run does not edit the sources), and each call costs three go
// commands (about 0.2 s with the binary in the cache).
var rlsOnce = sync.OnceValues(buildRLS)

// RLS returns the path of an rls binary built from the module's sources as
// they are. The binary is built once per state of the sources and shared:
// it lives in a cache directory (os.UserCacheDir()/rls-proctest) under a
// key that hashes every file of the module's packages that cmd/rls is built
// from (as `go list -deps` names them: Go files, embedded files), go.mod,
// go.sum, the Go version and settings, and the build flags. The test
// packages that `go test ./...` runs side by side, deploy/'s tests and the
// benchmarks all get the same file; the first one to ask builds it while
// the others wait on a lock file, and a later run with the same sources
// builds nothing. The binary is never rewritten in place (a new state of
// the sources gets a new file), so a process running it is never
// disturbed; the cache keeps the three last used and anything used within
// the hour. RLS may be called from any directory inside the repository,
// deploy/ included.
func RLS() (string, error) { return rlsOnce() }

// RLSBinary is RLS for a test, which fails when rls cannot be built.
func RLSBinary(tb testing.TB) string {
	tb.Helper()
	bin, err := RLS()
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// StartRLS runs rls with args (typically "serve" and its flags, among them
// --http-addr httpAddr) for a test, and waits until http://httpAddr/readyz
// answers 200; it fails the test, with rls's output, when rls exits first or
// is not ready within WaitLimit. The test's end stops it (SIGTERM) and fails
// the test unless it exits with status 0.
func StartRLS(tb testing.TB, httpAddr string, args ...string) *Proc {
	tb.Helper()
	p := Start(tb, Options{Name: "rls"}, append([]string{RLSBinary(tb)}, args...)...)
	if err := p.WaitFor(HTTPOK("http://" + httpAddr + "/readyz")); err != nil {
		tb.Fatalf("rls %s: %v\n%s", strings.Join(args, " "), err, p.Output())
	}
	return p
}

// Served is rls serving for a benchmark: its process, and the loopback
// addresses it serves gRPC and HTTP on.
type Served struct {
	*Proc
	GRPCAddr, HTTPAddr string
	dir                string // holds the config file
}

// Serve runs `bin serve` (bin: RLS(), or another build to compare with)
// with the config yaml, on two free loopback addresses, with args after
// its own flags, and waits until /readyz answers 200; on failure it stops
// rls and says why, with its output. The caller calls Stop on every other
// path. It is StartRLS for a benchmark, whose rls writes to stderr.
func Serve(o Options, bin, yaml string, args ...string) (*Served, error) {
	if o.Name == "" {
		o.Name = "rls"
	}
	addrs, err := FreeAddrs(2)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "rls-serve-")
	if err != nil {
		return nil, err
	}
	s := &Served{GRPCAddr: addrs[0], HTTPAddr: addrs[1], dir: dir}
	cfg := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	args = append([]string{bin, "serve", "--config", cfg, "--grpc-addr", s.GRPCAddr, "--http-addr", s.HTTPAddr}, args...)
	if s.Proc, err = Launch(o, args...); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := s.WaitFor(HTTPOK("http://" + s.HTTPAddr + "/readyz")); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, s.Output())
	}
	return s, nil
}

// Stop stops rls (Proc.Stop) and removes its config.
func (s *Served) Stop() error {
	err := s.Proc.Stop()
	os.RemoveAll(s.dir)
	return err
}

func buildRLS() (string, error) {
	bin, _, err := findOrBuild()
	return bin, err
}

// findOrBuild returns the binary for the sources as they are, and whether
// this call built it.
func findOrBuild() (bin string, built bool, err error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", false, fmt.Errorf("building rls: %w (go test puts its own go on PATH)", err)
	}
	root, err := moduleRoot(goCmd)
	if err != nil {
		return "", false, err
	}
	key, err := sourceKey(goCmd, root)
	if err != nil {
		return "", false, err
	}
	dir, err := cacheDir()
	if err != nil {
		return "", false, err
	}
	bin = filepath.Join(dir, "rls-"+key)
	if used(bin) {
		return bin, false, nil
	}
	unlock, err := lock(bin+".lock", buildWait)
	if err != nil {
		return "", false, err
	}
	defer unlock()
	if used(bin) { // built by whoever held the lock
		return bin, false, nil
	}
	if err := goBuild(goCmd, root, bin); err != nil {
		return "", false, err
	}
	prune(dir, bin)
	return bin, true, nil
}

// used reports whether bin exists, and marks it used now (prune keeps what
// was used lately).
func used(bin string) bool {
	if _, err := os.Stat(bin); err != nil {
		return false
	}
	now := time.Now()
	os.Chtimes(bin, now, now)
	return true
}

// goCommand runs go with args in dir and returns its stdout.
func goCommand(goCmd, dir string, env []string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), buildWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCmd, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return out, nil
}

// moduleRoot finds rls's module directory from the current one: the main
// module's, or the one deploy/'s go.mod points its replace directive at.
func moduleRoot(goCmd string) (string, error) {
	out, err := goCommand(goCmd, "", nil, "list", "-m", "-f", "{{.Dir}}", module)
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", module, err)
	}
	root := strings.TrimSpace(string(out))
	if root == "" {
		return "", fmt.Errorf("finding %s: go list -m names no directory (is it a dependency from the module cache?)", module)
	}
	return root, nil
}

// listedPackage is what sourceKey reads of `go list -json`.
type listedPackage struct {
	ImportPath string
	Dir        string
	Standard   bool
	Module     *struct {
		Path, Version string
		Main          bool
		Replace       *struct{ Path, Version string }
	}
	GoFiles, CgoFiles, CFiles, CXXFiles, HFiles, SFiles, SysoFiles, EmbedFiles []string
}

// sourceKey hashes what the build of cmd/rls reads: the files of the main
// module's packages it is built from, the versions of the other modules'
// (go.sum holds their content hashes), go.mod and go.sum, the toolchain and
// its settings, and the build flags.
func sourceKey(goCmd, root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s go %q\n", cgoOff, buildArgs(""))
	env, err := goCommand(goCmd, root, []string{cgoOff}, "env", "GOVERSION", "GOROOT", "GOOS", "GOARCH", "GOAMD64", "GOARM64", "GOEXPERIMENT", "GOFLAGS", "CGO_ENABLED")
	if err != nil {
		return "", err
	}
	h.Write(env)
	for _, f := range []string{"go.mod", "go.sum"} {
		if err := hashFile(h, root, f); err != nil {
			return "", err
		}
	}
	out, err := goCommand(goCmd, root, []string{cgoOff}, "list", "-deps",
		"-json=ImportPath,Dir,Standard,Module,GoFiles,CgoFiles,CFiles,CXXFiles,HFiles,SFiles,SysoFiles,EmbedFiles", "./cmd/rls")
	if err != nil {
		return "", err
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", fmt.Errorf("reading go list -deps ./cmd/rls: %w", err)
		}
		switch {
		case p.Standard:
			// The toolchain's: GOVERSION and GOROOT stand for it.
		case p.Module == nil || !p.Module.Main:
			m := p.Module
			if m == nil {
				return "", fmt.Errorf("go list: package %s belongs to no module", p.ImportPath)
			}
			fmt.Fprintf(h, "dep %s %s@%s", p.ImportPath, m.Path, m.Version)
			if m.Replace != nil {
				fmt.Fprintf(h, " => %s@%s", m.Replace.Path, m.Replace.Version)
			}
			h.Write([]byte("\n"))
		default:
			fmt.Fprintf(h, "pkg %s\n", p.ImportPath)
			files := slices.Concat(p.GoFiles, p.CgoFiles, p.CFiles, p.CXXFiles, p.HFiles, p.SFiles, p.SysoFiles, p.EmbedFiles)
			sort.Strings(files)
			for _, f := range files {
				if err := hashFile(h, p.Dir, f); err != nil {
					return "", err
				}
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:20], nil
}

// hashFile writes name, its length and its content into h.
func hashFile(h io.Writer, dir, name string) error {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return fmt.Errorf("hashing the sources of rls: %w", err)
	}
	fmt.Fprintf(h, "file %s %d\n", name, len(b))
	h.Write(b)
	return nil
}

// cacheDir is where the binaries are kept, created if need be.
func cacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "rls-proctest")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("the cache of rls binaries: %w", err)
	}
	return dir, nil
}

// lock takes an exclusive flock on path, waiting at most limit for another
// process to release it (a process that dies releases its locks). It
// returns the release.
func lock(path string, limit time.Duration) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("locking the build of rls: %w", err)
	}
	deadline := time.Now().Add(limit)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("locking %s: another process has been building rls for %v", path, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// goBuild builds cmd/rls into bin, through a temporary file renamed into
// place: bin appears whole or not at all.
func goBuild(goCmd, root, bin string) error {
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	defer os.Remove(tmp)
	if _, err := goCommand(goCmd, root, []string{cgoOff}, buildArgs(tmp)...); err != nil {
		return fmt.Errorf("building rls: %w", err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return fmt.Errorf("building rls: %w", err)
	}
	return nil
}

// prune removes the binaries (and their lock files) of the cache that are
// neither among the three last used nor used within the hour, and
// temporary files of builds that died. keep is never removed.
func prune(dir, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type bin struct {
		path string
		used time.Time
	}
	var bins []bin
	hourAgo := time.Now().Add(-time.Hour)
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue
		}
		path := filepath.Join(dir, e.Name())
		switch {
		case strings.Contains(e.Name(), ".tmp"):
			if info.ModTime().Before(hourAgo) {
				os.Remove(path)
			}
		case strings.HasPrefix(e.Name(), "rls-") && !strings.HasSuffix(e.Name(), ".lock"):
			bins = append(bins, bin{path, info.ModTime()})
		}
	}
	sort.Slice(bins, func(i, j int) bool { return bins[i].used.After(bins[j].used) })
	for i, b := range bins {
		if i < 3 || b.path == keep || b.used.After(hourAgo) {
			continue
		}
		os.Remove(b.path)
		os.Remove(b.path + ".lock")
	}
}

// ServeN runs n rls processes (Serve, the RLSBinary) with the config yaml
// and args for a test, named rls-0, rls-1… with their logs in the test's
// temporary directory; it fails the test when one does not start, and the
// test's end stops them.
func ServeN(tb testing.TB, n int, yaml string, args ...string) []*Served {
	tb.Helper()
	bin := RLSBinary(tb)
	procs := make([]*Served, 0, n)
	for i := range n {
		p, err := Serve(Options{Name: fmt.Sprintf("rls-%d", i), Log: filepath.Join(tb.TempDir(), "rls.log")}, bin, yaml, args...)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { p.Stop() })
		procs = append(procs, p)
	}
	return procs
}
