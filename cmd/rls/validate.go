package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/rlsproject/rls/internal/config"
)

// buildVersion is set at link time: -ldflags "-X main.buildVersion=v1.2.3".
var buildVersion = "dev"

// validate checks config files or directories and prints one line per
// domain and one per test file that a directory held (skipped), or one
// line per problem (path:line:col: message) and exits 1.
func validate(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rls validate", flag.ContinueOnError)
	var sizes configSizes
	sizes.define(fs)
	if err := commandFlags("validate", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	if fs.NArg() == 0 {
		return usageError{errors.New("usage: rls validate PATH... (at least one path)")}
	}
	limits, name, err := sizes.parse()
	if err != nil {
		return usageError{fmt.Errorf("--%s: %w", name, err)}
	}
	cfg, err := config.LoadWith(limits, fs.Args()...)
	if err != nil {
		printProblems(stdout, err)
		return errSilent
	}
	for _, d := range cfg.Domains() {
		nodes, limits := count(d.Descriptors)
		fmt.Fprintf(stdout, "%s: ok: %d descriptors, %d limits, %d http_descriptors (%s)\n", d.Name, nodes, limits, len(d.HTTPDescriptors), d.File)
	}
	for _, f := range cfg.Skipped() {
		fmt.Fprintf(stdout, "%s: skipped: a test file of rls test (tests: and no descriptors:)\n", f)
	}
	if len(cfg.Domains()) == 0 {
		fmt.Fprintln(stdout, "ok: no domains")
	}
	return nil
}

func count(nodes []*config.Descriptor) (descs, limits int) {
	for _, n := range nodes {
		d, l := count(n.Children)
		descs += 1 + d
		limits += len(n.Limits) + l
	}
	return descs, limits
}

// version prints build information.
func version(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rls version", flag.ContinueOnError)
	if err := commandFlags("version", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("version: unexpected argument %q", fs.Arg(0))}
	}
	rev, modified := "unknown", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = " (modified)"
				}
			}
		}
	}
	fmt.Fprintf(stdout, "rls %s\ncommit %s%s\n%s %s/%s\n", buildVersion, rev, modified, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
