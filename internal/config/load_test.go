package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"b.yaml":          domainDoc("b"),
		"a.yml":           domainDoc("a"),
		"c.yaml":          domainDoc("c1") + "---\n" + domainDoc("c2"),
		".hidden.yaml":    "not: [valid",
		"notes.txt":       "not yaml",
		"limits.yaml.bak": "not: [valid",
		"sub/d.yaml":      domainDoc("sub"),
		"dir.yaml/e.yaml": domainDoc("e"),
		"F.YAML":          domainDoc("upper"),
		"..data/a.yml":    domainDoc("a"), // a ConfigMap's real files: reached through symlinks only
		".git/x.yaml":     "not: [valid",
	})
	writeFiles(t, other, map[string]string{"target.yaml": domainDoc("linked")})
	if err := os.Symlink(filepath.Join(other, "target.yaml"), filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load(%s): %v", dir, err)
	}
	// Subdirectories too (as envoyproxy/ratelimit loads them), in name order
	// at each level; dot-files and dot-directories skipped.
	wantFiles := []string{
		filepath.Join(dir, "F.YAML"), filepath.Join(dir, "a.yml"), filepath.Join(dir, "b.yaml"),
		filepath.Join(dir, "c.yaml"), filepath.Join(dir, "dir.yaml", "e.yaml"),
		filepath.Join(dir, "link.yaml"), filepath.Join(dir, "sub", "d.yaml"),
	}
	if got := c.Files(); !slices.Equal(got, wantFiles) {
		t.Errorf("Files() = %q, want %q", got, wantFiles)
	}
	var names []string
	for _, d := range c.Domains() {
		names = append(names, d.Name)
	}
	if want := []string{"a", "b", "c1", "c2", "e", "linked", "sub", "upper"}; !slices.Equal(names, want) {
		t.Errorf("domains = %q, want %q", names, want)
	}
	// Limits are numbered in load order: files by name, then documents.
	var domainsInLimitOrder []string
	for _, l := range c.Limits() {
		for _, d := range c.Domains() {
			if slices.Contains(d.Descriptors, l.Descriptor) {
				domainsInLimitOrder = append(domainsInLimitOrder, d.Name)
			}
		}
	}
	if want := []string{"upper", "a", "b", "c1", "c2", "e", "linked", "sub"}; !slices.Equal(domainsInLimitOrder, want) {
		t.Errorf("Limits() by domain = %q, want %q", domainsInLimitOrder, want)
	}
	if d := c.Domain("c2"); d.File != filepath.Join(dir, "c.yaml") || d.Line != 6 {
		t.Errorf("Domain(c2) at %s:%d, want c.yaml:6", d.File, d.Line)
	}
}

func TestLoadFilesAndDirectories(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"one.conf": domainDoc("one"), "d/two.yaml": domainDoc("two")})
	c, err := Load(filepath.Join(dir, "one.conf"), filepath.Join(dir, "d"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Domain("one") == nil || c.Domain("two") == nil {
		t.Errorf("Load(file, dir): domains %v, want one and two (a named file loads whatever its extension)", c.Domains())
	}
}

func TestLoadDuplicateDomainAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": domainDoc("api"),
		"b.yaml": "# the same domain again\n" + domainDoc("api"),
	})
	_, err := Load(dir)
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	want := b + `:2:9: duplicate domain "api" (first defined at ` + a + `:1:9)`
	if err == nil || err.Error() != want {
		t.Errorf("Load(a.yaml, b.yaml with the same domain) error = %v, want %s", err, want)
	}
}

// TestLoadReportsAllFiles: problems of every file, in file order.
func TestLoadReportsAllFiles(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n",
		"b.yaml": "domain: b\nextra: 1\n",
		"c.yaml": domainDoc("c"),
	})
	_, err := Load(dir)
	want := filepath.Join(dir, "a.yaml") + `:4:24: descriptor "k": unit "eon" is not one of second|minute|hour|day|week|month|year` + "\n" +
		filepath.Join(dir, "b.yaml") + `:2:1: unknown key "extra" in domain (allowed: domain, descriptors, http_descriptors, reservation_key)`
	if err == nil || err.Error() != want {
		t.Errorf("Load error:\n%v\nwant:\n%s", err, want)
	}
}

func TestLoadEmpty(t *testing.T) {
	for _, paths := range [][]string{nil, {t.TempDir()}} {
		c, err := Load(paths...)
		if err != nil {
			t.Fatalf("Load(%q): %v", paths, err)
		}
		if len(c.Domains()) != 0 || len(c.Limits()) != 0 || len(c.Files()) != 0 || c.Domain("x") != nil {
			t.Errorf("Load(%q) = %+v, want an empty config", paths, c)
		}
		b, err := c.MarshalJSON()
		if want := "{\n  \"files\": [],\n  \"domains\": []\n}"; err != nil || string(b) != want {
			t.Errorf("Load(%q).MarshalJSON() = %s, %v; want %s", paths, b, err, want)
		}
	}
}

func TestLoadIOError(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	writeFiles(t, dir, map[string]string{"bad.yaml": "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"})
	// A path that cannot be read is one problem among the others, in the
	// same path:line:col form, and every other file is still checked.
	_, err := Load(missing, bad)
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 2 {
		t.Fatalf("Load(missing, bad) = %v; want an ErrorList of 2 problems", err)
	}
	if got, want := list[0].Error(), missing+":1:1: cannot read: no such file or directory"; got != want {
		t.Errorf("first problem %q, want %q", got, want)
	}
	if list[1].File != bad || !strings.Contains(list[1].Msg, "fortnight") {
		t.Errorf("second problem %q, want the bad unit of %s", list[1], bad)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false; want the cause kept", err)
	}
}

// TestLoadLinkedDirectories: a symlink loop and a link to a sibling
// directory are read once, so their domains are not duplicates.
func TestLoadLinkedDirectories(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": domainDoc("a"), "teams/b.yaml": domainDoc("b")})
	for link, target := range map[string]string{"self": ".", "loop": "teams", "teams/up": ".."} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load with symlink loops: %v", err)
	}
	if got := len(c.Files()); got != 2 || len(c.Domains()) != 2 {
		t.Errorf("files %q, domains %d; want each of the 2 files once", c.Files(), len(c.Domains()))
	}
	_, dirs, _ := ListConfig(dir)
	if len(dirs) != 2 {
		t.Errorf("directories %q, want the root and teams", dirs)
	}
}

// TestLoadUnreadableSubdirectory: a subdirectory rls cannot read (a
// lost+found owned by root at a volume's root) is passed over.
func TestLoadUnreadableSubdirectory(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a.yaml": domainDoc("a"), "lost+found/x.yaml": domainDoc("x")})
	// Not by chmod: root, as CI runs, reads any directory.
	readDir = func(name string) ([]os.DirEntry, error) {
		if filepath.Base(name) == "lost+found" || name == filepath.Join(dir, "unreadable") {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
		}
		return os.ReadDir(name)
	}
	t.Cleanup(func() { readDir = os.ReadDir })
	if c, err := Load(dir); err != nil || len(c.Domains()) != 1 {
		t.Errorf("Load with an unreadable subdirectory: %v, want domain a only", err)
	}
	// The path itself unreadable is a problem.
	writeFiles(t, dir, map[string]string{"unreadable/b.yaml": domainDoc("b")})
	var list ErrorList
	if _, err := Load(filepath.Join(dir, "unreadable")); !errors.As(err, &list) || len(list) != 1 || !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Load(an unreadable directory) = %v, want one problem for it", err)
	}
}

func TestLoadFileAndItsDirectory(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	writeFiles(t, dir, map[string]string{"a.yaml": domainDoc("a")})
	t.Chdir(dir)
	c, err := Load(file, dir, dir+"/./a.yaml", "a.yaml")
	if err != nil {
		t.Fatalf("Load(file, its directory): %v; want the file read once", err)
	}
	if len(c.Files()) != 1 || len(c.Domains()) != 1 {
		t.Errorf("files %v, domains %d; want 1 and 1", c.Files(), len(c.Domains()))
	}
}

func TestNilConfig(t *testing.T) {
	var c *Config
	if c.Domain("a") != nil || c.Domains() != nil || c.Limits() != nil || c.Files() != nil {
		t.Errorf("a nil *Config must answer like an empty one")
	}
}

// allocated returns the bytes f allocates (the heap's cumulative count).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestLoadFileCap: a file over MaxFileBytes is refused with its place and
// the cap; one at the cap loads.
func TestLoadFileCap(t *testing.T) {
	dir := t.TempDir()
	doc := domainDoc("a")
	const limit = 128
	atCap := doc + "#" + strings.Repeat("x", limit-len(doc)-2) + "\n"
	writeFiles(t, dir, map[string]string{"at.yaml": atCap, "over.yaml": atCap + "\n"})
	opts := LoadOptions{MaxFileBytes: limit}
	if c, err := LoadWith(opts, filepath.Join(dir, "at.yaml")); err != nil || c.Domain("a") == nil {
		t.Errorf("LoadWith(MaxFileBytes %d, a file of %d bytes) = %v; want domain a", limit, len(atCap), err)
	}
	over := filepath.Join(dir, "over.yaml")
	_, err := LoadWith(opts, over)
	if want := over + ":1:1: file is larger than the cap of 128 bytes on one config file"; err == nil || err.Error() != want {
		t.Errorf("LoadWith(MaxFileBytes %d, a file of %d bytes) error = %v, want %s", limit, len(atCap)+1, err, want)
	}
}

// TestLoadTotalCap: the files of one load together are bounded; the one
// that crosses the cap is named and the files after it are not read.
func TestLoadTotalCap(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": domainDoc("a"), "b.yaml": domainDoc("b"), "c.yaml": domainDoc("c"), "d.yaml": "not: [read",
	})
	size := int64(len(domainDoc("a")))
	if c, err := LoadWith(LoadOptions{MaxTotalBytes: 3 * size}, filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "c.yaml")); err != nil || len(c.Domains()) != 3 {
		t.Errorf("LoadWith(MaxTotalBytes = the 3 files) = %v; want 3 domains", err)
	}
	_, err := LoadWith(LoadOptions{MaxTotalBytes: 2*size + 1}, dir)
	want := filepath.Join(dir, "c.yaml") + fmt.Sprintf(":1:1: config files together are larger than the cap of %d bytes on all files", 2*size+1)
	if err == nil || err.Error() != want {
		t.Errorf("LoadWith(MaxTotalBytes %d, 4 files of %d bytes) error =\n%v\nwant (d.yaml not read):\n%s", 2*size+1, size, err, want)
	}
}

// TestLoadHugeSparseFile: a 1 GiB file is refused at once, without being
// read, under the default caps.
func TestLoadHugeSparseFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var loadErr error
	n := allocated(func() { _, loadErr = Load(path) })
	if want := path + ":1:1: file is larger than the cap of 8 MiB (8388608 bytes) on one config file"; loadErr == nil || loadErr.Error() != want {
		t.Errorf("Load(1 GiB sparse file) error = %v, want %s", loadErr, want)
	}
	if n > 1<<20 {
		t.Errorf("Load(1 GiB sparse file) allocated %d bytes, want under 1 MiB", n)
	}
}

// TestLoadEndlessDevice: a file whose size says nothing (a device, a pipe)
// is read up to the cap and no further.
func TestLoadEndlessDevice(t *testing.T) {
	const limit = 64 << 10
	var err error
	n := allocated(func() { _, err = LoadWith(LoadOptions{MaxFileBytes: limit}, "/dev/zero") })
	if want := "/dev/zero:1:1: file is larger than the cap of 65536 bytes on one config file"; err == nil || err.Error() != want {
		t.Errorf("LoadWith(MaxFileBytes %d, /dev/zero) error = %v, want %s", limit, err, want)
	}
	// The buffer grows as it is read: a few times the cap at most.
	if n > 8*limit {
		t.Errorf("LoadWith(MaxFileBytes %d, /dev/zero) allocated %d bytes, want at most %d", limit, n, 8*limit)
	}
}

// BenchmarkLoad100k loads one file of 100,000 descriptors (about 8 MB, in
// flow style) and reports, besides time and allocations, the heap the
// loaded Config keeps (live-B).
func BenchmarkLoad100k(b *testing.B) {
	var cfg strings.Builder
	cfg.WriteString("domain: big\ndescriptors:\n")
	for i := range 100000 {
		fmt.Fprintf(&cfg, "  - {key: user, value: u%d, rate_limit: {unit: minute, requests_per_unit: 100}}\n", i)
	}
	path := filepath.Join(b.TempDir(), "big.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var live uint64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c, err := Load(path)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		live = after.HeapAlloc - before.HeapAlloc
		runtime.KeepAlive(c)
	}
	b.ReportMetric(float64(live), "live-B")
}

// TestLoadDirectoryWithTestFiles: a directory holding the test files of
// rls test beside its limits (as the README recommends) loads: a file
// whose first document has a top-level tests: and no descriptors: is
// skipped and listed in Skipped, whatever its name; a config typo still
// fails, in a file with tests: and descriptors: too; a test file named
// itself is refused as one.
func TestLoadDirectoryWithTestFiles(t *testing.T) {
	const testFile = "domain: api\nstart: 2030-01-01T00:00:00Z\ntests:\n  - name: one\n    steps: [{descriptors: [k=v], expect: OK}]\n"
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"limits.yaml":         domainDoc("api"),
		"limits_test.yaml":    testFile,
		"sub/checks.yml":      "tests: []\n", // no domain: still a test file
		"sub/more/other.yaml": domainDoc("other"),
	})
	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load(a directory with test files): %v", err)
	}
	wantSkipped := []string{filepath.Join(dir, "limits_test.yaml"), filepath.Join(dir, "sub", "checks.yml")}
	if got := c.Skipped(); !slices.Equal(got, wantSkipped) {
		t.Errorf("Skipped() = %q, want %q", got, wantSkipped)
	}
	wantFiles := []string{filepath.Join(dir, "limits.yaml"), filepath.Join(dir, "sub", "more", "other.yaml")}
	if got := c.Files(); !slices.Equal(got, wantFiles) {
		t.Errorf("Files() = %q, want %q", got, wantFiles)
	}
	if len(c.Domains()) != 2 || c.Domain("api") == nil || c.Domain("other") == nil {
		t.Errorf("domains %v, want api and other", c.Domains())
	}

	for _, tc := range []struct {
		name, text, want string
	}{
		{"a typo beside a domain", "domain: x\ndescriptor: []\n",
			`:2:1: unknown key "descriptor" in domain (did you mean "descriptors"?)`},
		{"tests: beside descriptors:", domainDoc("x") + "tests: []\n",
			`:5:1: unknown key "tests" in domain (allowed: domain, descriptors, http_descriptors, reservation_key)`},
		{"tests: beside http_descriptors:", "domain: x\nhttp_descriptors: []\ntests: []\n",
			`:3:1: unknown key "tests" in domain`},
	} {
		bad := t.TempDir()
		writeFiles(t, bad, map[string]string{"limits.yaml": domainDoc("api"), "limits_test.yaml": testFile, "x.yaml": tc.text})
		_, err := Load(bad)
		if want := filepath.Join(bad, "x.yaml") + tc.want; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Load = %v, want %s", tc.name, err, want)
		}
	}

	named := filepath.Join(dir, "limits_test.yaml")
	_, err = Load(filepath.Join(dir, "limits.yaml"), named)
	if want := named + ":1:1: a test file of rls test (a top-level tests: and no descriptors:), not a config: run it with rls test CONFIG " + named; err == nil || err.Error() != want {
		t.Errorf("Load(limits.yaml, limits_test.yaml) = %v, want %s", err, want)
	}
}

// TestLoadRepositoryConfig: the repository's config directory, the
// example limits with their test files beside them, loads whole.
func TestLoadRepositoryConfig(t *testing.T) {
	c, err := Load("../../config")
	if err != nil {
		t.Fatalf("Load(config/): %v", err)
	}
	if len(c.Skipped()) == 0 || len(c.Files()) == 0 {
		t.Errorf("Load(config/): files %q, skipped %q; want the limits loaded and their test files skipped", c.Files(), c.Skipped())
	}
	for _, f := range c.Skipped() {
		if !strings.HasSuffix(f, "_test.yaml") {
			t.Errorf("Load(config/) skipped %s, which is not a test file", f)
		}
	}
}
