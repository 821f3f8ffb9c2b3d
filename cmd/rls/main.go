// Command rls is a rate-limit server for Envoy (RateLimitService v3 and
// ext_authz) and nginx (auth_request).
//
//	rls serve [flags]     (also plain `rls`)
//	rls validate PATH...
//	rls version
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if err != errSilent {
			fmt.Fprintln(os.Stderr, "rls:", err)
		}
		os.Exit(exitCode(err))
	}
}

// run is the whole program; main only wires the process to it.
func run(ctx context.Context, args, env []string, stdout, stderr io.Writer) error {
	return runWith(ctx, args, env, stdout, stderr, hooks{})
}

// runWith is run with the hooks that tests change.
func runWith(ctx context.Context, args, env []string, stdout, stderr io.Writer, h hooks) error {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, env, stderr, h)
	case "validate":
		return validate(args, stdout, stderr)
	case "version":
		return version(stdout)
	case "healthcheck":
		return healthcheck(ctx, args, stdout)
	case "help":
		usage(stdout)
		return nil
	}
	usage(stderr)
	return usageError{fmt.Errorf("unknown command %q", cmd)}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage:
  rls [serve] [flags]    serve the rate-limit APIs (rls serve -h lists the flags)
  rls validate PATH...   check config files or directories, change nothing
  rls version            print build information
  rls healthcheck [URL]  exit 0 when URL (default http://127.0.0.1:8080/readyz) answers 200;
                         for container health checks in images without curl
`)
}
