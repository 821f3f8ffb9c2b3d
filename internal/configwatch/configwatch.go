// Package configwatch tells when the config files under a path have
// changed: it watches the file's directory (or the directory and its
// subdirectories) with inotify, waits for a quiet moment, and reports a
// change only when the content of the YAML files differs from the last
// report. Atomic renames, editors' temporary files and Kubernetes ConfigMap
// symlink swaps are all just events that lead to a content check. It knows
// nothing of parsing; which files count is descriptors.ListConfig's call.
package configwatch

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/rlsproject/rls/internal/descriptors"
)

// Fingerprint returns a hash of the YAML files that path stands for
// (descriptors.ListConfig), in order. Unreadable paths count as their
// error text.
func Fingerprint(path string) [32]byte {
	files, _, unreadable := descriptors.ListConfig(path)
	return fingerprint(files, unreadable)
}

func fingerprint(files []string, unreadable []error) [32]byte {
	h := sha256.New()
	for _, err := range unreadable {
		fmt.Fprintf(h, "unreadable: %v\x00", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		if err != nil {
			fmt.Fprintf(h, "error: %v", err)
		}
		h.Write(data)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// Watch calls onChange each time the content under path changes, at most
// once per quiet period, until ctx ends. It returns when ctx ends (nil) or
// when the watch cannot be set up.
func Watch(ctx context.Context, path string, quiet time.Duration, log *slog.Logger, onChange func()) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}
	defer w.Close()
	dir := path
	if st, err := os.Stat(path); err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	} else if !st.IsDir() {
		dir = filepath.Dir(path)
	}
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watching %s: %w", dir, err)
	}
	// A config file that is a symlink into another directory (a ConfigMap
	// mounted with subPath, a hand-made link): watch the target's directory
	// too.
	if target, err := filepath.EvalSymlinks(path); err == nil && target != path {
		if tdir := filepath.Dir(target); tdir != dir && !isDir(path) {
			if err := w.Add(tdir); err != nil {
				log.Warn("config watch: cannot watch the symlink target's directory", "dir", tdir, "error", err)
			}
		}
	}

	// scan lists the files once: it watches every subdirectory (they are
	// loaded too; new ones appear) and returns the fingerprint.
	scan := func() [32]byte {
		files, dirs, unreadable := descriptors.ListConfig(path)
		for _, d := range dirs {
			if d != dir {
				if err := w.Add(d); err != nil {
					log.Warn("config watch: cannot watch a subdirectory", "dir", d, "error", err)
				}
			}
		}
		return fingerprint(files, unreadable)
	}

	last := scan()
	timer := time.NewTimer(quiet)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("config watch: watcher closed")
			}
			log.Debug("config watch event", "event", ev.String())
			timer.Reset(quiet)
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("config watch: watcher closed")
			}
			log.Warn("config watch", "error", err)
		case <-timer.C:
			if fp := scan(); fp != last {
				last = fp
				onChange()
			}
		}
	}
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
