package configwatch

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/servetest"
)

// Helpers shared by the package's tests. A test runs Watch on a fake
// clock and follows it through its observer: it waits for the events it
// caused, moves the clock past the check's instant, and reads the check's
// verdict. Nothing waits on the wall clock but hang guards.

// t0 is the fake clock's start.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// testOpts are the options of the watches under test.
var testOpts = Options{Quiet: 250 * time.Millisecond, MaxWait: 2 * time.Second}

// fakeClock is a clock that moves only when the test says so. Its timer
// delivers when Advance reaches the armed instant.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	at    time.Time
	armed bool
	c     chan time.Time
	// canceled tells of a delivery that Arm replaced, before the watcher
	// took it, by a later one (an event came first): the check is
	// postponed.
	canceled chan struct{}
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: t0, c: make(chan time.Time, 1), canceled: make(chan struct{}, 64)}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) C() <-chan time.Time { return f.c }

func (f *fakeClock) Arm(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	replaced := false
	select {
	case <-f.c: // a delivery not taken yet is replaced, as time.Timer.Reset does
		replaced = true
	default:
	}
	f.at, f.armed = t, true
	if !f.fireLocked() && replaced {
		f.canceled <- struct{}{}
	}
}

// Advance moves the clock by d and reports whether the timer delivered.
func (f *fakeClock) Advance(d time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	return f.fireLocked()
}

// fireLocked delivers when the armed instant has come; requires f.mu held.
func (f *fakeClock) fireLocked() bool {
	if !f.armed || f.at.After(f.now) {
		return false
	}
	f.armed = false
	f.c <- f.now
	return true
}

// event is one event the watcher handled.
type event struct {
	name     string
	relevant bool
}

// recorder is the observer of a watch under test.
type recorder struct {
	ready  chan struct{}
	events chan event
	checks chan bool
}

func (r *recorder) started()                         { close(r.ready) }
func (r *recorder) event(name string, relevant bool) { r.events <- event{name, relevant} }
func (r *recorder) checked(changed bool)             { r.checks <- changed }

// watch is a Watch under test.
type watch struct {
	t       *testing.T
	clock   *fakeClock
	rec     *recorder
	changes chan struct{}
	log     *servetest.SyncBuffer
	parent  string // the directory above the config's, watched for its entry
	settles int
}

// guard bounds every wait of a test: it fails a hung test, it times
// nothing.
const guard = 30 * time.Second

// startWatch runs Watch on path with testOpts, a fake clock and a
// recorder, and returns once the watch is set up.
func startWatch(t *testing.T, path string) *watch {
	t.Helper()
	return startWatchWith(t, path, nil)
}

// startWatchWith is startWatch with Options.Loaded.
func startWatchWith(t *testing.T, path string, loaded *[32]byte) *watch {
	t.Helper()
	w := &watch{
		t:       t,
		clock:   newFakeClock(),
		rec:     &recorder{ready: make(chan struct{}), events: make(chan event, 4096), checks: make(chan bool, 64)},
		changes: make(chan struct{}, 64),
		log:     &servetest.SyncBuffer{},
	}
	w.parent = filepath.Dir(path)
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		w.parent = filepath.Dir(w.parent)
	}
	opts := testOpts
	opts.clock, opts.observer, opts.Loaded = w.clock, w.rec, loaded
	opts.Log = slog.New(slog.NewTextHandler(w.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Watch(ctx, path, opts, func() { w.changes <- struct{}{} }) }()
	select {
	case <-w.rec.ready:
	case err := <-done:
		cancel()
		t.Fatalf("Watch(%s) = %v before it started", path, err)
	case <-time.After(guard):
		t.Fatalf("Watch(%s) not started within %v", path, guard)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch returned %v, want nil after cancel", err)
		}
	})
	return w
}

// waitEvent waits until the watcher has handled an event named name
// (earlier events are passed over) and returns whether it counted.
func (w *watch) waitEvent(name string) bool {
	w.t.Helper()
	evs := w.eventsUntil(name)
	return evs[len(evs)-1].relevant
}

// eventsUntil returns the events the watcher handles up to the first one
// named name, that one included.
func (w *watch) eventsUntil(name string) []event {
	w.t.Helper()
	var evs []event
	timeout := time.After(guard)
	for {
		select {
		case ev := <-w.rec.events:
			evs = append(evs, ev)
			if ev.name == name {
				return evs
			}
		case <-timeout:
			w.t.Fatalf("no event for %s within %v; log:\n%s", name, guard, w.log.String())
		}
	}
}

// check moves the clock past the instant of the pending check, which the
// events handled so far set, and returns the check's verdict. Then it
// settles the watch for the next step.
func (w *watch) check(what string) bool {
	w.t.Helper()
	if !w.clock.Advance(testOpts.MaxWait) {
		w.t.Fatalf("%s: no check pending after %v: the watcher took no event as relevant; log:\n%s", what, testOpts.MaxWait, w.log.String())
	}
	changed := w.verdict(what)
	w.settle()
	return changed
}

// look moves the clock on by MaxWait while the watched path is missing
// (nothing is watched: no event, no settling) and returns the verdict of
// the look it sets off.
func (w *watch) look(what string) bool {
	w.t.Helper()
	if !w.clock.Advance(testOpts.MaxWait) {
		w.t.Fatalf("%s: no look pending after %v; log:\n%s", what, testOpts.MaxWait, w.log.String())
	}
	return w.verdict(what)
}

// settle waits until the watcher has handled every event of the steps so
// far, so that the next step's events are its own: it writes a marker
// next to the config's directory (an event that does not count) and waits
// for its event. Events that came after a check leave a check pending;
// the next step's check makes it, and it sees that step's files.
func (w *watch) settle() {
	w.t.Helper()
	if _, err := os.Stat(w.parent); err != nil {
		return // gone, as the test wants: no event to wait for
	}
	// A marker again each second until one's event comes: a directory
	// made again where one was just deleted is watched again only when
	// the old one's removal comes through, and a marker written before
	// that has no event.
	timeout := time.After(guard)
	for {
		w.settles++
		marker := filepath.Join(w.parent, fmt.Sprintf(".settle-%d", w.settles))
		write(w.t, marker, "")
		again := time.After(time.Second)
	wait:
		for {
			select {
			case ev := <-w.rec.events:
				if ev.name != marker {
					continue
				}
				if ev.relevant {
					w.t.Fatalf("the marker %s was taken as relevant", marker)
				}
				return
			case <-again:
				break wait
			case <-timeout:
				w.t.Fatalf("no event for a marker in %s within %v; log:\n%s", w.parent, guard, w.log.String())
			}
		}
	}
}

// verdict waits for the check the clock set off and returns whether it
// found the files changed (and then called onChange). An event handled
// before the watcher took the clock's delivery postpones the check: the
// clock is moved on again.
func (w *watch) verdict(what string) bool {
	w.t.Helper()
	timeout := time.After(guard)
	for {
		select {
		case changed := <-w.rec.checks:
			if changed {
				select {
				case <-w.changes:
				default:
					w.t.Errorf("%s: a change was found but onChange was not called", what)
				}
			}
			return changed
		case <-w.clock.canceled:
			w.clock.Advance(testOpts.MaxWait)
		case <-timeout:
			w.t.Fatalf("%s: the check did not end within %v", what, guard)
		}
	}
}

// expectChange checks after the events up to name and wants a change
// (want) or none.
func (w *watch) expectChange(what, name string, want bool) {
	w.t.Helper()
	if !w.waitEvent(name) {
		w.t.Fatalf("%s: the event for %s was not taken as relevant", what, name)
	}
	if got := w.check(what); got != want {
		w.t.Errorf("%s: check found a change: %v, want %v", what, got, want)
	}
}

// logged reports whether the watcher logged a line holding all of parts.
func (w *watch) logged(parts ...string) bool {
	for _, line := range strings.Split(w.log.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
