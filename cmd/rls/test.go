package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/ruletest"
)

func testDetails(w io.Writer) {
	fmt.Fprint(w, `CONFIG is a YAML file or a directory, as rls serve --config takes it. Each TESTFILE holds
cases: timelines of requests on a virtual clock, each decided by rls's own service on a fresh
memory store whose clock is the case's (no server, no Redis), with the verdict (expect: OK or
expect: OVER_LIMIT), statuses and headers each step expects. Prints PASS name or
FAIL name: step N: got ..., want ... per case, then N passed, M failed. Exit status: 0 when
every case passes, 1 when one fails or a file has a problem (path:line:col lines), 2 for a bad
command line. The format: docs/testing.md.

  rls test config/limits.yaml config/limits_test.yaml
`)
}

// ruleTest runs test files against a config (rls test).
func ruleTest(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rls test", flag.ContinueOnError)
	var sizes configSizes
	sizes.define(fs)
	if err := commandFlags("test", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	if fs.NArg() < 2 {
		return usageError{errors.New("usage: rls test CONFIG TESTFILE... (a config and at least one test file)")}
	}
	limits, name, err := sizes.parse()
	if err != nil {
		return usageError{fmt.Errorf("--%s: %w", name, err)}
	}
	cfg, err := config.LoadWith(limits, fs.Arg(0))
	if err != nil {
		printProblems(stdout, err)
		return errSilent
	}
	passed, failed, bad := 0, 0, false
	for _, path := range fs.Args()[1:] {
		f, err := ruletest.LoadFile(path)
		if err != nil {
			printProblems(stdout, err)
			bad = true
			continue
		}
		p, q := ruletest.Run(cfg, f, stdout)
		passed, failed = passed+p, failed+q
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 || bad {
		return errSilent
	}
	return nil
}

// printProblems prints err one problem per line (path:line:col: message).
func printProblems(w io.Writer, err error) {
	var list config.ErrorList
	if errors.As(err, &list) {
		for _, e := range list {
			fmt.Fprintln(w, e.Error())
		}
		return
	}
	fmt.Fprintln(w, err.Error())
}
