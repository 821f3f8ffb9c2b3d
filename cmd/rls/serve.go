package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/grpcserver"
)

// serve runs `rls serve`: the server of the Config that args and env give
// (rls's flags, or envoyproxy/ratelimit's environment with --compat),
// until ctx is done (SIGTERM/SIGINT), then drains it.
func serve(ctx context.Context, args, env []string, stdout, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, env, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	return runServer(ctx, cfg, env, stderr)
}

// runServer runs the server of cfg, logging to stderr, until ctx is done,
// then drains it; SIGHUP reloads its config.
func runServer(ctx context.Context, cfg daemon.Config, env []string, stderr io.Writer) error {
	log := cfg.Logging.Logger(stderr)
	// SIGHUP reloads. Caught from the start: its default action would end
	// the process if it came while the listeners start.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tuneGC(cfg.Store, env, log)

	srv, err := daemon.New(ctx, cfg, log)
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-hup:
				srv.Reload("SIGHUP")
			case <-stop:
				return
			}
		}
	})
	err = srv.Run(ctx)
	close(stop)
	wg.Wait()
	return err
}

// tuneGC sets the collector for the heap that the store bounds, leaving
// what the environment's GOGC and GOMEMLIMIT set.
func tuneGC(store daemon.Store, env []string, log *slog.Logger) {
	heapBound := int64(0)
	if store.Kind == daemon.Memory {
		heapBound = store.Memory.MaxBytes
	}
	set := func(name string) bool {
		return slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
	}
	if gogc, limit := grpcserver.TuneGC(heapBound, grpcserver.EnvGC{GOGC: set("GOGC"), GOMEMLIMIT: set("GOMEMLIMIT")}); gogc != 0 || limit != 0 {
		log.Debug("garbage collector tuned", "gogc", gogc, "memory_limit", limit)
	}
}
