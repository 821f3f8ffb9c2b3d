package configwatch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
)

// TestDebounce: a check comes Quiet after the last event of a spell, but
// no later than MaxWait after its first; a clock that steps back counts as
// no time passed.
func TestDebounce(t *testing.T) {
	d := debounce{quiet: 250 * time.Millisecond, maxWait: 2 * time.Second}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	steps := []struct {
		what string
		at   time.Time
		fire bool // the check is made before this step's event
		want time.Time
	}{
		{what: "first event", at: ms(0), want: ms(250)},
		{what: "another within the quiet period", at: ms(100), want: ms(350)},
		{what: "busy: every 100ms", at: ms(1600), want: ms(1850)},
		{what: "busy, near the maximum", at: ms(1900), want: ms(2000)},
		{what: "busy, past the maximum", at: ms(2100), want: ms(2000)},
		{what: "after the check: a new spell", at: ms(3000), fire: true, want: ms(3250)},
		{what: "clock stepped back", at: ms(2500), want: ms(3250)},
	}
	for i, s := range steps {
		if s.fire {
			d.fired()
		}
		if got := d.event(s.at); !got.Equal(s.want) {
			t.Errorf("step %d (%s): event(t0+%v) = check at t0+%v, want t0+%v", i, s.what, s.at.Sub(t0), got.Sub(t0), s.want.Sub(t0))
		}
	}
}

func TestFileWritesAndAtomicRenames(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	write(t, path, "domain: a\n")
	w := startWatch(t, path)

	write(t, path, "domain: b\n")
	w.expectChange("write in place", path, true)

	tmp := filepath.Join(dir, ".limits.yaml.tmp")
	write(t, tmp, "domain: c\n")
	must(t, os.Rename(tmp, path))
	w.expectChange("atomic rename over the file", path, true)

	now := time.Now()
	must(t, os.Chtimes(path, now, now))
	write(t, filepath.Join(dir, "other.txt"), "x")
	w.expectChange("touch and an unrelated file", filepath.Join(dir, "other.txt"), false)
}

func TestDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	w := startWatch(t, dir)
	write(t, filepath.Join(dir, "b.yml"), "domain: b\n")
	w.expectChange("a new file", filepath.Join(dir, "b.yml"), true)
	must(t, os.Remove(filepath.Join(dir, "a.yaml")))
	w.expectChange("a removed file", filepath.Join(dir, "a.yaml"), true)
	write(t, filepath.Join(dir, "notes.md"), "x")
	w.expectChange("a non-YAML file", filepath.Join(dir, "notes.md"), false)
	// The parent is watched for the directory's own entry only.
	sibling := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-sibling.yaml")
	write(t, sibling, "x")
	if w.waitEvent(sibling) {
		t.Errorf("a file next to the config directory was taken as relevant")
	}
}

// TestSubdirectories: files in subdirectories are loaded, so a change in
// one is seen, in a subdirectory made after the watch started too.
func TestSubdirectories(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "teams", "a", "a.yaml"), "domain: a\n")
	w := startWatch(t, dir)
	write(t, filepath.Join(dir, "teams", "a", "a.yaml"), "domain: a2\n")
	w.expectChange("a write in a subdirectory", filepath.Join(dir, "teams", "a", "a.yaml"), true)
	must(t, os.Mkdir(filepath.Join(dir, "teams", "b"), 0o755))
	w.expectChange("an empty new subdirectory", filepath.Join(dir, "teams", "b"), false)
	write(t, filepath.Join(dir, "teams", "b", "b.yaml"), "domain: b\n")
	w.expectChange("a file in the new subdirectory", filepath.Join(dir, "teams", "b", "b.yaml"), true)
	write(t, filepath.Join(dir, "teams", "b", "b.yaml"), "domain: b2\n")
	w.expectChange("a write in the new subdirectory", filepath.Join(dir, "teams", "b", "b.yaml"), true)
}

// TestConfigMapSymlinkSwap reproduces how the kubelet updates a mounted
// ConfigMap: the files are symlinks through ..data, which is swapped
// atomically to a new timestamped directory, again and again.
func TestConfigMapSymlinkSwap(t *testing.T) {
	for _, watchFile := range []bool{false, true} {
		t.Run(fmt.Sprintf("file=%v", watchFile), func(t *testing.T) {
			dir := t.TempDir()
			version := func(n int) string {
				name := fmt.Sprintf("..2026_01_01_00_00_0%d.1", n)
				write(t, filepath.Join(dir, name, "limits.yaml"), fmt.Sprintf("domain: v%d\n", n))
				return name
			}
			must(t, os.Symlink(version(1), filepath.Join(dir, "..data")))
			must(t, os.Symlink(filepath.Join("..data", "limits.yaml"), filepath.Join(dir, "limits.yaml")))
			watched := dir
			if watchFile {
				watched = filepath.Join(dir, "limits.yaml")
			}
			w := startWatch(t, watched)
			for n := 2; n <= 4; n++ {
				must(t, os.Symlink(version(n), filepath.Join(dir, "..data_tmp")))
				must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
				w.expectChange(fmt.Sprintf("swap %d of ..data", n-1), filepath.Join(dir, "..data"), true)
				must(t, os.RemoveAll(filepath.Join(dir, fmt.Sprintf("..2026_01_01_00_00_0%d.1", n-1))))
			}
		})
	}
}

// TestDirectoryRecreated: the config directory deleted and made again
// (rm -rf, mkdir, new files) is watched again; before, the first change
// loaded and the later ones were missed.
func TestDirectoryRecreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "conf")
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	w := startWatch(t, dir)
	must(t, os.RemoveAll(dir))
	write(t, filepath.Join(dir, "a.yaml"), "domain: a2\n")
	w.expectChange("directory deleted and made again", dir, true)
	if !w.logged("re-watching a replaced directory", "dir="+dir) {
		t.Errorf("no re-watching line in the log:\n%s", w.log.String())
	}
	write(t, filepath.Join(dir, "b.yaml"), "domain: b\n")
	w.expectChange("a new file in the new directory", filepath.Join(dir, "b.yaml"), true)
	write(t, filepath.Join(dir, "b.yaml"), "domain: b2\n")
	w.expectChange("a write in the new directory", filepath.Join(dir, "b.yaml"), true)
}

// TestDirectoryRenamedOver: a new directory renamed into the config's
// place (the old one moved aside) is watched; the old one no longer is.
func TestDirectoryRenamedOver(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "conf")
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	w := startWatch(t, dir)
	write(t, filepath.Join(root, "conf.new", "a.yaml"), "domain: new\n")
	must(t, os.Rename(dir, filepath.Join(root, "conf.old")))
	must(t, os.Rename(filepath.Join(root, "conf.new"), dir))
	w.expectChange("directory swapped by rename", dir, true)
	write(t, filepath.Join(dir, "b.yaml"), "domain: b\n")
	w.expectChange("a new file in the new directory", filepath.Join(dir, "b.yaml"), true)
	// The old directory's files are not the config any more: no event of
	// theirs comes before that of a file written after them.
	write(t, filepath.Join(root, "marker1"), "x")
	w.eventsUntil(filepath.Join(root, "marker1"))
	write(t, filepath.Join(root, "conf.old", "c.yaml"), "domain: c\n")
	write(t, filepath.Join(root, "marker2"), "x")
	for _, ev := range w.eventsUntil(filepath.Join(root, "marker2")) {
		if ev.relevant {
			t.Errorf("after the swap, event %s (from the moved-aside directory) was taken as relevant", ev.name)
		}
	}
}

// TestSymlinkedDirectorySwapped: a config path that is a symlink to a
// directory, pointed elsewhere (ln -sfn), is followed to its new target.
func TestSymlinkedDirectorySwapped(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "v1", "a.yaml"), "domain: v1\n")
	write(t, filepath.Join(root, "v2", "a.yaml"), "domain: v2\n")
	link := filepath.Join(root, "current")
	must(t, os.Symlink("v1", link))
	w := startWatch(t, link)
	must(t, os.Symlink("v2", link+".tmp"))
	must(t, os.Rename(link+".tmp", link))
	w.expectChange("symlink swapped to v2", link, true)
	write(t, filepath.Join(root, "v2", "b.yaml"), "domain: b\n")
	w.expectChange("a new file in v2", filepath.Join(link, "b.yaml"), true)
}

// TestRuntimeRootSwapped: envoyproxy/ratelimit's layout, the config
// directory below a symlink (RUNTIME_ROOT=/srv/runtime_data/current, the
// config in current/ratelimit/config) that a deployment points at a new
// version: the swap of the link two levels up is seen, and so is a file
// added in the new version.
func TestRuntimeRootSwapped(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "v1", "ratelimit", "config", "a.yaml"), "domain: v1\n")
	write(t, filepath.Join(root, "v2", "ratelimit", "config", "a.yaml"), "domain: v2\n")
	link := filepath.Join(root, "current")
	must(t, os.Symlink("v1", link))
	config := filepath.Join(link, "ratelimit", "config")
	w := startWatch(t, config)
	must(t, os.Symlink("v2", link+".tmp"))
	must(t, os.Rename(link+".tmp", link))
	w.expectChange("RUNTIME_ROOT swapped to v2", link, true)
	write(t, filepath.Join(root, "v2", "ratelimit", "config", "b.yaml"), "domain: b\n")
	w.expectChange("a new file in v2", filepath.Join(config, "b.yaml"), true)
}

// TestDirectoryGoneAndBack: with the config's directory and its parent
// deleted, no event can tell of their return: the watcher looks for them
// every MaxWait and watches them again.
func TestDirectoryGoneAndBack(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "etc")
	dir := filepath.Join(parent, "conf")
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	w := startWatch(t, dir)
	must(t, os.RemoveAll(parent))
	w.expectChange("directory and parent deleted", filepath.Join(dir, "a.yaml"), true)
	if !w.logged("the config directory is gone") {
		t.Errorf("the directory's absence is not logged:\n%s", w.log.String())
	}
	if w.check("still gone") {
		t.Errorf("still gone: a change was found")
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: back\n")
	if !w.check("back") {
		t.Errorf("back: no change found")
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: back2\n")
	w.expectChange("a write after the return", filepath.Join(dir, "a.yaml"), true)
}

// TestBusyNeighbourDoesNotPostponeForever: a neighbour file rewritten every
// 100ms kept the quiet period from ever ending; the check now comes at
// most MaxWait after the first event.
func TestBusyNeighbourDoesNotPostponeForever(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	neighbour := filepath.Join(dir, "app.log")
	w := startWatch(t, dir)
	write(t, filepath.Join(dir, "a.yaml"), "domain: b\n")
	w.waitEvent(filepath.Join(dir, "a.yaml"))
	const step = 100 * time.Millisecond
	for i := 1; i <= 40; i++ {
		if w.clock.Advance(step) {
			// At MaxWait, or earlier when the neighbour's events came late
			// enough to leave a quiet period (a busy machine): never later.
			if elapsed := time.Duration(i) * step; elapsed > testOpts.MaxWait {
				t.Errorf("checked %v after the first event, want by %v (MaxWait)", elapsed, testOpts.MaxWait)
			}
			if !w.verdict("the check at MaxWait") {
				t.Errorf("the check found no change, want the a.yaml write")
			}
			return
		}
		write(t, neighbour, fmt.Sprintf("line %d\n", i))
		w.waitEvent(neighbour)
	}
	t.Errorf("no check within 4s of fake time while the neighbour kept writing")
}

func TestFingerprint(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	const limit = 64
	fp := func() [32]byte {
		files, _, unreadable := config.ListConfig(dir)
		return fingerprint(files, unreadable, limit)
	}
	first := fp()
	write(t, filepath.Join(dir, ".hidden.yaml"), "x")
	write(t, filepath.Join(dir, "readme.txt"), "x")
	if fp() != first {
		t.Error("dot-files and non-YAML files changed the fingerprint")
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: b\n")
	if fp() == first {
		t.Error("a changed YAML file kept the fingerprint")
	}
	// Past the cap a file is not read: its size stands for it.
	big := make([]byte, 2*limit)
	write(t, filepath.Join(dir, "big.yaml"), string(big))
	withBig := fp()
	big[limit+10] = 'x'
	write(t, filepath.Join(dir, "big.yaml"), string(big))
	if fp() != withBig {
		t.Error("a change past the cap of a file over the cap changed the fingerprint: it was read")
	}
	write(t, filepath.Join(dir, "big.yaml"), string(big[:limit]))
	if fp() == withBig {
		t.Error("a file brought under the cap kept the fingerprint")
	}
	// A file whose size says nothing is read up to the cap only.
	if a, b := fingerprint([]string{"/dev/zero"}, nil, limit), fingerprint([]string{"/dev/zero"}, nil, limit); a != b {
		t.Error("two fingerprints of /dev/zero differ")
	}
}

// TestDirectoryMissingAtStart: a config directory that does not exist when
// the watch starts (envoyproxy/ratelimit's RUNTIME_ROOT not mounted yet,
// CONFIG_TYPE=FILE) is looked for every MaxWait, and its appearance is a
// change; then it is watched as any. Watch returned an error at once, and
// the directory was never loaded.
func TestDirectoryMissingAtStart(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	dir := filepath.Join(root, "ratelimit", "config")
	w := startWatch(t, dir)
	if w.look("still missing") {
		t.Errorf("still missing: a change was found")
	}
	if !w.logged("the config path does not exist") {
		t.Errorf("the path's absence is not logged:\n%s", w.log.String())
	}
	write(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	if !w.look("made") {
		t.Errorf("made with a file: no change found")
	}
	w.settle()
	write(t, filepath.Join(dir, "a.yaml"), "domain: b\n")
	w.expectChange("a write after it came", filepath.Join(dir, "a.yaml"), true)
}

// TestFileMissingAtStart: likewise for a config file, with the caller's
// fingerprint of the missing path (as rls takes it before loading).
func TestFileMissingAtStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc")
	path := filepath.Join(dir, "limits.yaml")
	loaded := Fingerprint(path, config.LoadOptions{})
	w := startWatchWith(t, path, &loaded)
	w.parent = filepath.Dir(dir) // markers beside the file's directory, not in it
	if w.look("still missing") {
		t.Errorf("still missing: a change was found")
	}
	write(t, path, "domain: a\n")
	if !w.look("written") {
		t.Errorf("written: no change found")
	}
	w.settle()
	write(t, path, "domain: b\n")
	w.expectChange("a write after it came", path, true)
}

// TestChangedWhileStarting: content that changed between the caller's load
// (the Fingerprint it took before) and the start of the watch is reported
// at once, with no event after the start; the fingerprint of unchanged
// content is the same.
func TestChangedWhileStarting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	write(t, path, "domain: a\n")
	loaded := Fingerprint(path, config.LoadOptions{})
	if again := Fingerprint(path, config.LoadOptions{}); again != loaded {
		t.Fatal("two fingerprints of the same content differ")
	}
	write(t, path, "domain: b\n")
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- Watch(ctx, path, Options{Loaded: &loaded}, func() { changes <- struct{}{} })
	}()
	select {
	case <-changes:
	case err := <-done:
		t.Fatalf("Watch = %v before reporting the change", err)
	case <-time.After(guard):
		t.Fatalf("a change made before the watch started not reported within %v", guard)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch = %v, want nil after cancel", err)
	}
}
