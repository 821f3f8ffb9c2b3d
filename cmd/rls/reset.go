package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rlsproject/rls/internal/httpapi"
)

// resetFlags are rls reset's flags.
type resetFlags struct {
	addr      string
	tokenFile string
	timeout   time.Duration
	json      bool
}

func newResetFlagSet() (*flag.FlagSet, *resetFlags) {
	fs := flag.NewFlagSet("rls reset", flag.ContinueOnError)
	f := &resetFlags{}
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "rls's HTTP `address` (host:port, or a URL)")
	fs.StringVar(&f.tokenFile, "token-file", "", "a `file` holding the bearer token of rls's --admin-token-file (needed off loopback, and from loopback too when rls runs with --admin-require-token)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "bound on the request")
	fs.BoolVar(&f.json, "json", false, "print the JSON answer as it comes")
	return fs, f
}

func resetDetails(w io.Writer) {
	fmt.Fprint(w, `Asks a running rls (POST /admin/reset on its HTTP address) to clear the counters of every
limit that the descriptors match: all windows, whatever the algorithm, as if never used.
DOMAIN and DESCRIPTOR arguments as for rls check (key=value[,key=value...]). rls answers
loopback clients, and others that send the bearer token of its --admin-token-file (give
the same file with --token-file; with --admin-require-token, loopback clients need it
too). Each reset is logged by rls with who asked. Exit status: 0 when rls reset the
counters, 3 when the request failed, 2 for a bad command line.

  rls reset api remote_address=203.0.113.7
  rls reset --addr rls.internal:8080 --token-file /etc/rls/admin-token api api_key=k1

flags:
`)
	fs, _ := newResetFlagSet()
	printFlags(w, fs, nil, false)
}

// reset asks a running rls's /admin/reset and prints what it cleared.
func reset(ctx context.Context, args []string, stdout io.Writer) error {
	fs, f := newResetFlagSet()
	if err := commandFlags("reset", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	if fs.NArg() < 2 {
		return usageError{fmt.Errorf("reset: want DOMAIN DESCRIPTOR... (rls reset --help)")}
	}
	c := checkFlags{n: 1}
	req, err := c.request(fs.Args())
	if err != nil {
		return usageError{fmt.Errorf("reset: %w (rls reset --help)", err)}
	}
	body, err := protojson.Marshal(req)
	if err != nil {
		return err
	}
	token, err := readToken("reset", f.tokenFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	answer, err := postAdmin(ctx, "reset", f.addr, "/admin/reset", token, body)
	if err != nil {
		return err
	}
	var res httpapi.ResetResult
	if done, err := readAnswer("reset", "a reset's", answer, f.json, stdout, &res); done || err != nil {
		return err
	}
	for _, d := range res.Descriptors {
		limits := "no limit"
		if len(d.Limits) > 0 {
			limits = strings.Join(d.Limits, ", ")
		}
		fmt.Fprintf(stdout, "%s %s: %s\n", res.Domain, d, limits)
	}
	fmt.Fprintf(stdout, "%d counters cleared\n", res.Cleared)
	return nil
}
