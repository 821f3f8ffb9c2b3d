// Command rls is a rate-limit server for Envoy (RateLimitService v3 and
// ext_authz) and nginx (auth_request).
//
//	rls [serve] [flags]
//	rls validate PATH...
//	rls check [flags] DOMAIN DESCRIPTOR...
//	rls explain [flags] DOMAIN [DESCRIPTOR...]
//	rls reset [flags] DOMAIN DESCRIPTOR...
//	rls override set|list|delete [flags] ...
//	rls test CONFIG TESTFILE...
//	rls top [flags] [DOMAIN]
//	rls replay --config CANDIDATE [--baseline CONFIG] LOG...
//	rls healthcheck [flags] [URL]
//	rls version
//	rls help [COMMAND]
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/rlsproject/rls/internal/compat"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, compatArgs(os.Args[0], os.Args[1:]), os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, "rls:", msg)
		}
		os.Exit(exitCode(err))
	}
}

// compatArgs returns the arguments of run for a process started as argv0
// with args: under the name ratelimit (compat.ProgramName), `serve --compat
// envoy-ratelimit` (the reference takes no arguments); otherwise args as
// they are.
func compatArgs(argv0 string, args []string) []string {
	if filepath.Base(argv0) != compat.ProgramName {
		return args
	}
	return append([]string{"serve", "--compat", compat.Mode}, args...)
}

// run is the whole program; main only wires the process to it.
func run(ctx context.Context, args, env []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			return help(nil, stdout)
		case "-version", "--version":
			return version(nil, stdout)
		}
		if len(args[0]) > 0 && args[0][0] != '-' {
			cmd, args = args[0], args[1:]
		}
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, env, stdout, stderr)
	case "validate":
		return validate(args, stdout)
	case "check":
		return check(ctx, args, stdout)
	case "explain":
		return explain(ctx, args, stdout)
	case "reset":
		return reset(ctx, args, stdout)
	case "override":
		return override(ctx, args, stdout)
	case "test":
		return ruleTest(args, stdout)
	case "top":
		return top(ctx, args, stdout)
	case "replay":
		return replayCommand(args, stdout)
	case "version":
		return version(args, stdout)
	case "healthcheck":
		return healthcheck(ctx, args, stdout)
	case "help":
		return help(args, stdout)
	}
	return usageError{fmt.Errorf("unknown command %q (rls help lists them)", cmd)}
}
