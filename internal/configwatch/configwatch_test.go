package configwatch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// watcher runs Watch on path and counts the changes it reports.
type watcher struct {
	changes chan struct{}
	cancel  context.CancelFunc
	done    chan error
}

func startWatch(t *testing.T, path string) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{changes: make(chan struct{}, 16), cancel: cancel, done: make(chan error, 1)}
	started := make(chan struct{})
	go func() {
		close(started)
		w.done <- Watch(ctx, path, 50*time.Millisecond, slog.New(slog.DiscardHandler), func() { w.changes <- struct{}{} })
	}()
	<-started
	time.Sleep(50 * time.Millisecond) // let the watch be set up before the test writes
	t.Cleanup(func() {
		cancel()
		if err := <-w.done; err != nil {
			t.Errorf("Watch returned %v, want nil after cancel", err)
		}
	})
	return w
}

// expect waits for one change (want) or makes sure none comes.
func (w *watcher) expect(t *testing.T, what string, want bool) {
	t.Helper()
	select {
	case <-w.changes:
		if !want {
			t.Errorf("%s: a change was reported, want none", what)
		}
	case <-time.After(2 * time.Second):
		if want {
			t.Errorf("%s: no change reported within 2s", what)
		}
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFileWritesAndAtomicRenames(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	write(t, path, "domain: a\n")
	w := startWatch(t, path)

	write(t, path, "domain: b\n")
	w.expect(t, "write in place", true)

	tmp := filepath.Join(dir, ".limits.yaml.tmp")
	write(t, tmp, "domain: c\n")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	w.expect(t, "atomic rename over the file", true)

	now := time.Now()
	if err := os.Chtimes(path, now, now); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "other.txt"), "x")
	w.expect(t, "touch and an unrelated file", false)
}

func TestDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	w := startWatch(t, dir)
	write(t, filepath.Join(dir, "b.yml"), "domain: b\n")
	w.expect(t, "a new file", true)
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	w.expect(t, "a removed file", true)
	write(t, filepath.Join(dir, "notes.md"), "x")
	w.expect(t, "a non-YAML file", false)
}

// TestSubdirectories: files in subdirectories are loaded, so a change in
// one is seen, in a subdirectory made after the watch started too.
func TestSubdirectories(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "teams", "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "teams", "a", "a.yaml"), "domain: a\n")
	w := startWatch(t, dir)
	write(t, filepath.Join(dir, "teams", "a", "a.yaml"), "domain: a2\n")
	w.expect(t, "a write in a subdirectory", true)
	if err := os.Mkdir(filepath.Join(dir, "teams", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.expect(t, "an empty new subdirectory", false)
	write(t, filepath.Join(dir, "teams", "b", "b.yaml"), "domain: b\n")
	w.expect(t, "a file in the new subdirectory", true)
	write(t, filepath.Join(dir, "teams", "b", "b.yaml"), "domain: b2\n")
	w.expect(t, "a write in the new subdirectory", true)
}

// TestConfigMapSymlinkSwap reproduces how the kubelet updates a mounted
// ConfigMap: the files are symlinks through ..data, which is swapped
// atomically to a new timestamped directory.
func TestConfigMapSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	mkVersion := func(name, content string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, name, "limits.yaml"), content)
	}
	mkVersion("..2026_01_01_00_00_00.1", "domain: one\n")
	if err := os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/limits.yaml", filepath.Join(dir, "limits.yaml")); err != nil {
		t.Fatal(err)
	}
	for _, watched := range []string{dir, filepath.Join(dir, "limits.yaml")} {
		t.Run(filepath.Base(watched), func(t *testing.T) {
			w := startWatch(t, watched)
			next := "..2026_01_01_00_00_00." + filepath.Base(t.Name())
			mkVersion(next, "domain: "+filepath.Base(t.Name())+"\n")
			if err := os.Symlink(next, filepath.Join(dir, "..data_tmp")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
			w.expect(t, "..data swapped", true)
		})
	}
}

func TestFingerprint(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	fp := Fingerprint(dir)
	write(t, filepath.Join(dir, ".hidden.yaml"), "x")
	write(t, filepath.Join(dir, "readme.txt"), "x")
	if Fingerprint(dir) != fp {
		t.Error("dot-files and non-YAML files changed the fingerprint")
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: b\n")
	if Fingerprint(dir) == fp {
		t.Error("a changed YAML file kept the fingerprint")
	}
}

func TestWatchMissingPath(t *testing.T) {
	err := Watch(context.Background(), filepath.Join(t.TempDir(), "nope.yaml"), time.Millisecond, slog.New(slog.DiscardHandler), func() {})
	if err == nil {
		t.Error("Watch(missing file) = nil, want an error")
	}
}
