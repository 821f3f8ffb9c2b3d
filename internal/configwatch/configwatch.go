// Package configwatch tells when the config files under a path have
// changed: it watches the config's directory, its subdirectories and the
// directory above it with inotify, waits for a quiet moment (but never
// longer than a maximum after the first event), and reports a change only
// when the content of the YAML files differs from the last report. Atomic
// renames, editors' temporary files, Kubernetes ConfigMap symlink swaps, a
// symlink among the directories above swapped (envoyproxy/ratelimit's
// RUNTIME_ROOT) and a directory deleted and made again or replaced by a
// rename are all just
// events that lead to a content check; a directory that was replaced is
// watched again, and one missing (at the start too) is looked for until it
// comes. It knows nothing of parsing; which files count is
// config.ListConfig's call.
package configwatch

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/rlsproject/rls/internal/config"
)

// Defaults of Options.
const (
	DefaultQuiet   = 250 * time.Millisecond
	DefaultMaxWait = 2 * time.Second
)

// Options tune Watch. The zero value gives the defaults.
type Options struct {
	// Quiet is how long the files must be left alone before they are
	// checked (DefaultQuiet).
	Quiet time.Duration
	// MaxWait bounds how long a check waits after the first event of a
	// busy spell, so that a neighbour file rewritten without pause does
	// not postpone it forever (DefaultMaxWait, and at least Quiet). While
	// the config's directory is missing, it is looked for this often.
	MaxWait time.Duration
	// Limits are the caps the config is loaded with: a file is
	// fingerprinted up to its cap only.
	Limits config.LoadOptions
	// Log receives what the watcher does; nil discards it.
	Log *slog.Logger
	// Loaded is the Fingerprint of the content the caller loaded, taken
	// before it loaded it: content that differs when the watch starts (a
	// change while the caller started) is reported at once. Nil: the
	// content when the watch starts is the caller's.
	Loaded *[32]byte

	clock    clock    // nil: the real one
	observer observer // tests: nil
}

func (o Options) withDefaults() Options {
	if o.Quiet <= 0 {
		o.Quiet = DefaultQuiet
	}
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultMaxWait
	}
	o.MaxWait = max(o.MaxWait, o.Quiet)
	o.Limits = o.Limits.WithDefaults()
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.clock == nil {
		o.clock = newRealClock()
	}
	if o.observer == nil {
		o.observer = noObserver{}
	}
	return o
}

// Watch calls onChange each time the content under path changes, at
// most once per check, until ctx ends. A path that does not exist yet (a
// volume not mounted, a directory made later) is looked for every MaxWait
// until it does; its appearance is a change. Watch returns when ctx ends
// (nil) or when the watch cannot be set up (path unreadable, no inotify).
func Watch(ctx context.Context, path string, opts Options, onChange func()) error {
	opts = opts.withDefaults()
	loaded := opts.Loaded
	st, err := os.Stat(path)
	awaited := errors.Is(err, fs.ErrNotExist)
	if awaited {
		if loaded == nil {
			// The caller's content: none.
			fp := Fingerprint(path, opts.Limits)
			loaded = &fp
		}
		if st, err = awaitPath(ctx, path, opts); st == nil {
			return err
		}
	}
	if err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}
	defer fsw.Close()
	w := &watcher{path: path, isDir: st.IsDir(), opts: opts, fs: fsw, watched: make(map[string]os.FileInfo)}
	w.dir = path
	if !w.isDir {
		w.dir = filepath.Dir(path)
	}
	w.parent = filepath.Dir(w.dir)
	w.wait = debounce{quiet: opts.Quiet, maxWait: opts.MaxWait}
	w.last = w.check()
	if _, ok := w.watched[w.dir]; !ok {
		return fmt.Errorf("watching %s: cannot watch %s", path, w.dir)
	}
	changed := loaded != nil && *loaded != w.last
	if changed {
		if !awaited {
			opts.Log.Info("config changed while starting", "path", path)
		}
		onChange()
	}
	if awaited {
		opts.observer.checked(changed) // the look that found it
	} else {
		opts.observer.started()
	}
	return w.run(ctx, onChange)
}

// awaitPath looks for path every MaxWait (each look is a check for the
// observer) until it exists, and returns what it is; nil when ctx ends
// first, with the error of a path that cannot be looked at.
func awaitPath(ctx context.Context, path string, opts Options) (os.FileInfo, error) {
	opts.Log.Warn("config watch: the config path does not exist; looking for it periodically", "path", path, "every", opts.MaxWait)
	opts.clock.Arm(opts.clock.Now().Add(opts.MaxWait))
	opts.observer.started()
	for {
		select {
		case <-ctx.Done():
			return nil, nil
		case <-opts.clock.C():
		}
		st, err := os.Stat(path)
		switch {
		case err == nil:
			opts.Log.Info("config watch: the config path exists now", "path", path)
			return st, nil
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("watching %s: %w", path, err)
		}
		opts.clock.Arm(opts.clock.Now().Add(opts.MaxWait))
		opts.observer.checked(false)
	}
}

// Fingerprint identifies the content of the config under path as Watch
// sees it, for Options.Loaded.
func Fingerprint(path string, limits config.LoadOptions) [32]byte {
	files, _, unreadable := config.ListConfig(path)
	return fingerprint(files, unreadable, limits.WithDefaults().MaxFileBytes)
}

// watcher is the state of one Watch. It is used by Watch's goroutine only.
type watcher struct {
	path   string
	isDir  bool   // path is a directory (else a file)
	dir    string // the directory whose entries are the config: path, or the file's directory
	parent string // dir's parent, watched for dir's own entry only (replaced, removed)
	opts   Options
	fs     *fsnotify.Watcher
	// watched are the directories watched, each as it was when its watch
	// was added: one found different (replaced) is watched again.
	watched map[string]os.FileInfo
	// content says which watched directories hold config: their events
	// count. The parent's count only for dir's own name.
	content map[string]bool
	// links are the ancestors of dir that are symlinks (RUNTIME_ROOT's
	// "current", swapped to deploy a new version): an event on one counts,
	// and the directory that holds it is watched.
	links map[string]bool
	last  [32]byte // fingerprint of the last report
	wait  debounce
}

// run handles events until ctx ends.
func (w *watcher) run(ctx context.Context, onChange func()) error {
	log := w.opts.Log
	missing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.fs.Events:
			if !ok {
				return errors.New("config watch: watcher closed")
			}
			relevant := w.relevant(ev)
			log.Debug("config watch event", "event", ev.String(), "relevant", relevant)
			if _, watched := w.watched[ev.Name]; watched && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				w.watchAgain(ev.Name)
			}
			if relevant {
				w.opts.clock.Arm(w.wait.event(w.opts.clock.Now()))
			}
			w.opts.observer.event(ev.Name, relevant)
		case err, ok := <-w.fs.Errors:
			if !ok {
				return errors.New("config watch: watcher closed")
			}
			// A full event queue loses events: check anyway.
			log.Warn("config watch", "error", err)
			w.opts.clock.Arm(w.wait.event(w.opts.clock.Now()))
		case <-w.opts.clock.C():
			w.wait.fired()
			fp := w.check()
			changed := fp != w.last
			if changed {
				w.last = fp
				onChange()
			}
			// With the config's directory gone, no event may announce its
			// return (its parent may be gone too): look again later.
			_, err := os.Stat(w.dir)
			if gone := err != nil; gone != missing {
				missing = gone
				if gone {
					log.Warn("config watch: the config directory is gone; looking for it periodically", "dir", w.dir, "every", w.opts.MaxWait)
				}
			}
			if missing {
				w.opts.clock.Arm(w.opts.clock.Now().Add(w.opts.MaxWait))
			}
			w.opts.observer.checked(changed)
		}
	}
}

// relevant says whether ev may change the config: an event in a directory
// holding config, or on the config's directory itself.
func (w *watcher) relevant(ev fsnotify.Event) bool {
	return ev.Name == w.dir || w.content[ev.Name] || w.content[filepath.Dir(ev.Name)] || w.links[ev.Name]
}

// check lists the config files, brings the watches in line with the
// directories that hold them, and returns their fingerprint. Watching
// first, reading after: a change made in between is in the fingerprint or
// brings an event.
func (w *watcher) check() [32]byte {
	files, dirs, unreadable := config.ListConfig(w.path)
	want := map[string]bool{w.dir: true}
	for _, d := range dirs {
		want[d] = true
	}
	if !w.isDir {
		// A config file that is a symlink into another directory (a
		// ConfigMap's ..data, a hand-made link): that directory too.
		if target, err := filepath.EvalSymlinks(w.path); err == nil {
			want[filepath.Dir(target)] = true
		}
	}
	if _, ok := want[w.parent]; !ok {
		want[w.parent] = false
	}
	w.links = make(map[string]bool)
	for a := filepath.Dir(w.dir); a != filepath.Dir(a); a = filepath.Dir(a) {
		if st, err := os.Lstat(a); err == nil && st.Mode()&os.ModeSymlink != 0 {
			w.links[a] = true
			if _, ok := want[filepath.Dir(a)]; !ok {
				want[filepath.Dir(a)] = false
			}
		}
	}
	w.rewatch(want)
	return fingerprint(files, unreadable, w.opts.Limits.MaxFileBytes)
}

// rewatch watches the directories of want (a directory that does not
// exist is left for later), again any that was replaced since its watch
// was added, and no others. A replaced directory has lost its watch
// (deleted or moved: fsnotify drops it) or is another directory than the
// one watched (a symlink that now points elsewhere); a new directory may
// have the inode number of the deleted one, so both are looked at.
func (w *watcher) rewatch(want map[string]bool) {
	log := w.opts.Log
	held := make(map[string]bool)
	for _, dir := range w.fs.WatchList() {
		held[dir] = true
	}
	for dir := range want {
		st, err := os.Stat(dir)
		if err != nil || !st.IsDir() {
			continue // gone: an event on its parent, or the next check, brings it back
		}
		old, had := w.watched[dir]
		if had && held[dir] && os.SameFile(old, st) {
			continue
		}
		if had {
			_ = w.fs.Remove(dir) // the replaced directory's watch, if fsnotify still holds it
		}
		if err := w.fs.Add(dir); err != nil {
			log.Warn("config watch: cannot watch a directory", "dir", dir, "error", err)
			continue
		}
		if had {
			log.Info("config watch: re-watching a replaced directory", "dir", dir)
		} else {
			log.Debug("config watch: watching", "dir", dir)
		}
		w.watched[dir] = st
	}
	for dir := range w.watched {
		if _, ok := want[dir]; !ok {
			_ = w.fs.Remove(dir)
			delete(w.watched, dir)
		}
	}
	w.content = want
}

// watchAgain watches dir again after an event said that the directory its
// watch was on is gone, if one is there again: a directory deleted and made
// again (with, maybe, the inode number of the old one) before a check saw
// it gone is taken by the check for the one it watches, whose watch
// fsnotify drops when this event comes.
func (w *watcher) watchAgain(dir string) {
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return // gone: the next check, or the periodic look, brings it back
	}
	if err := w.fs.Add(dir); err != nil {
		w.opts.Log.Warn("config watch: cannot watch a directory", "dir", dir, "error", err)
		return
	}
	w.opts.Log.Info("config watch: re-watching a replaced directory", "dir", dir)
	w.watched[dir] = st
}

// fingerprint hashes the YAML files (with their names) and the errors of
// those that cannot be read. A file is read up to limit+1 bytes: past its
// cap it cannot load anyway, so its size stands for the rest.
func fingerprint(files []string, unreadable []error, limit int64) [32]byte {
	h := sha256.New()
	for _, err := range unreadable {
		fmt.Fprintf(h, "unreadable: %v\x00", err)
	}
	for _, name := range files {
		fmt.Fprintf(h, "%s\x00", name)
		n, err := hashFile(h, name, limit)
		fmt.Fprintf(h, "\x00%d\x00", n)
		if err != nil {
			fmt.Fprintf(h, "error: %v\x00", err)
		}
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// hashFile writes up to limit+1 bytes of the file called name to h; a
// regular file bigger than limit is not read. It returns the file's size,
// or the bytes read when the size says nothing (a pipe).
func hashFile(h io.Writer, name string, limit int64) (int64, error) {
	f, err := os.Open(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > limit {
		return st.Size(), nil
	}
	return io.Copy(h, io.LimitReader(f, limit+1))
}

// debounce decides when a spell of events is checked: Quiet after its
// last event, but no later than MaxWait after its first. Time is a
// parameter; an instant earlier than the last event counts as no time
// passed.
type debounce struct {
	quiet, maxWait time.Duration
	pending        bool
	first, last    time.Time // events of the pending spell
}

// event records an event at now and returns when to check.
func (d *debounce) event(now time.Time) time.Time {
	if !d.pending {
		d.pending, d.first, d.last = true, now, now
	}
	if now.After(d.last) {
		d.last = now
	}
	due := d.last.Add(d.quiet)
	if limit := d.first.Add(d.maxWait); due.After(limit) {
		due = limit
	}
	return due
}

// fired ends the pending spell: the check is made.
func (d *debounce) fired() { d.pending = false }

// clock is the watcher's time and its one timer: the real ones, or a
// test's.
type clock interface {
	Now() time.Time
	// Arm makes C deliver once at instant t (at once if t has passed),
	// replacing any earlier arming.
	Arm(t time.Time)
	C() <-chan time.Time
}

type realClock struct{ timer *time.Timer }

func newRealClock() *realClock {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &realClock{timer: t}
}

func (c *realClock) Now() time.Time      { return time.Now() }
func (c *realClock) Arm(t time.Time)     { c.timer.Reset(time.Until(t)) }
func (c *realClock) C() <-chan time.Time { return c.timer.C }

// observer sees what the watcher does, for tests to follow it without
// waiting on the wall clock.
type observer interface {
	started()                         // the watch is set up
	event(name string, relevant bool) // an event was handled
	checked(changed bool)             // the files were checked
}

type noObserver struct{}

func (noObserver) started()           {}
func (noObserver) event(string, bool) {}
func (noObserver) checked(bool)       {}
