package compat

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/xdsconfig"
)

// runtimeDir is the config source of CONFIG_TYPE=FILE: rls's own file
// source on RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, which
// starts with no limits when the directory does not exist (a volume mounted
// later), as the reference does, and logs the keys its grammar ignored. It
// is used by one server.
type runtimeDir struct {
	*daemon.FileSource
	files daemon.Files
}

func newRuntimeDir(files daemon.Files) *runtimeDir {
	return &runtimeDir{FileSource: daemon.NewFileSource(files), files: files}
}

// Initial loads the directory; an empty config when it does not exist
// (the watch then looks for it, and loads it when it comes).
func (r *runtimeDir) Initial(log *slog.Logger) (*config.Config, error) {
	_, statErr := os.Stat(r.files.Path)
	cfg, err := r.FileSource.Initial(log) // also when missing: the watch compares with what it saw
	if errors.Is(statErr, fs.ErrNotExist) {
		log.Warn("no config directory: starting with no limits", "path", r.files.Path)
		return config.LoadWith(r.files.Limits)
	}
	if err != nil {
		return nil, err
	}
	logWarnings(cfg, log)
	return cfg, nil
}

// xdsSource is the config source of CONFIG_TYPE=GRPC_XDS_SOTW: an xDS
// client (internal/xdsconfig) whose configs go through the file loader's
// validation (FromXDS), a refused set NACKed and the old config kept. It
// is used by one server.
type xdsSource struct {
	opts xdsconfig.Options
	// forceStart: ready (and /healthcheck 200) before a first config, with
	// an empty one (FORCE_START_WITHOUT_INITIAL_CONFIG).
	forceStart bool
	limits     config.LoadOptions // their Parse: the grammar (MERGE_DOMAIN_CONFIG)
}

// Initial is an empty config with FORCE_START_WITHOUT_INITIAL_CONFIG, else
// none: the server is not ready until the xDS server sends one.
func (x *xdsSource) Initial(*slog.Logger) (*config.Config, error) {
	if x.forceStart {
		return config.LoadWith(x.limits)
	}
	return nil, nil
}

// Run runs the xDS client until ctx ends. There is nothing to reload when
// asked: the config is what the server sent.
func (x *xdsSource) Run(ctx context.Context, to daemon.Target, asked <-chan string, log *slog.Logger) {
	o := x.opts
	o.Logger = log
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if err := xdsconfig.New(o, xdsTarget{to: to, parse: x.limits.Parse, log: log}).Run(ctx); err != nil {
			log.Error("xDS client stopped", "error", err)
		}
	})
	for {
		select {
		case <-ctx.Done():
			return
		case why := <-asked:
			log.Info(why + ": the config comes from xDS; nothing to reload")
		}
	}
}

// xdsTarget loads the configs of the xDS client into the service, through
// the loader's validation; a refused set keeps the old config and is
// NACKed.
type xdsTarget struct {
	to    daemon.Target
	parse config.ParseOptions
	log   *slog.Logger
}

func (t xdsTarget) Load(version string, configs []*rlsconfv3.RateLimitConfig) error {
	return t.to.Reload(func() (*config.Config, error) {
		cfg, err := FromXDS(t.parse, configs)
		if err != nil {
			return nil, fmt.Errorf("xDS version %s: %w", version, err)
		}
		logWarnings(cfg, t.log)
		return cfg, nil
	})
}

// logWarnings logs, in one line, the keys that a load ignored (the
// reference's keys out of place: ParseOptions).
func logWarnings(cfg *config.Config, log *slog.Logger) {
	if ws := cfg.Warnings(); len(ws) > 0 {
		text := make([]string, len(ws))
		for i, w := range ws {
			text[i] = w.Error()
		}
		log.Warn("config keys ignored, as envoyproxy/ratelimit ignores them", "count", len(ws), "keys", strings.Join(text, "; "))
	}
}
