package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/configwatch"
)

// Source is where a server's config comes from and how it stays current:
// rls's own files (FileSource), or what a front end plugs in
// (Plugins.Source). The server calls Initial once, then Run once.
type Source interface {
	// Initial returns the config the server starts with. nil with no
	// error means none yet: the service answers as for unknown domains,
	// and /readyz and /healthcheck say not ready, until Run brings one. An
	// error stops the start.
	Initial(log *slog.Logger) (*config.Config, error)
	// Run keeps the config current until ctx ends, loading each new one
	// through to, one load at a time. asked receives the reloads asked of
	// the server (Server.Reload), each with why, for the log ("SIGHUP").
	Run(ctx context.Context, to Target, asked <-chan string, log *slog.Logger)
}

// Target is what a Source loads configs into: the service. Reload loads a
// config with load and makes it current; on error the current config stays
// (and the error is logged and returned).
type Target interface {
	Reload(load func() (*config.Config, error)) error
}

// FileSource is rls's own config source: the files of Files, loaded at
// start, reloaded when asked and, with Files.Watch, when they change (a
// change made while the server starts included). It is used by one server:
// Initial, then Run.
type FileSource struct {
	files Files
	// loaded is the fingerprint of the files taken before the first load,
	// so that the watch reports a change made while the server started.
	loaded [32]byte
}

// NewFileSource returns the source of files.
func NewFileSource(files Files) *FileSource {
	return &FileSource{files: files}
}

// Initial loads the files. An error names the path, with one line per
// problem.
func (s *FileSource) Initial(log *slog.Logger) (*config.Config, error) {
	s.loaded = configwatch.Fingerprint(s.files.Path, s.files.Limits)
	cfg, err := s.load(log)()
	if err != nil {
		return nil, fmt.Errorf("loading config %s:\n%w", s.files.Path, err)
	}
	return cfg, nil
}

// load returns the load of the files, which logs the test files of rls
// test that a config directory holds and the load passed over.
func (s *FileSource) load(log *slog.Logger) func() (*config.Config, error) {
	return func() (*config.Config, error) {
		cfg, err := config.LoadWith(s.files.Limits, s.files.Path)
		for _, f := range cfg.Skipped() {
			log.Info("config: skipped a test file of rls test (tests: and no descriptors:)", "file", f)
		}
		return cfg, err
	}
}

// Run reloads the files when asked and, with Files.Watch, when they
// change, until ctx ends. A watch that cannot be set up is logged; asked
// reloads still work.
func (s *FileSource) Run(ctx context.Context, to Target, asked <-chan string, log *slog.Logger) {
	changed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	if s.files.Watch {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wg.Go(func() { s.watch(wctx, changed, log) })
	}
	for {
		select {
		case <-ctx.Done():
			return
		case why := <-asked:
			log.Info(why + ": reloading config")
			to.Reload(s.load(log))
		case <-changed:
			log.Info("config files changed: reloading")
			to.Reload(s.load(log))
		}
	}
}

// watch signals changed (without blocking) when the files change, until
// ctx ends.
func (s *FileSource) watch(ctx context.Context, changed chan<- struct{}, log *slog.Logger) {
	err := configwatch.Watch(ctx, s.files.Path, configwatch.Options{Limits: s.files.Limits, Log: log, Loaded: &s.loaded}, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		log.Warn("not watching the config; SIGHUP still reloads it", "error", err)
	}
}
