package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rlsproject/rls/internal/httpapi"
)

// topFlags are rls top's flags.
type topFlags struct {
	addr      string
	tokenFile string
	name      string
	by        string
	n         int
	interval  time.Duration
	timeout   time.Duration
	once      bool
	json      bool
}

func newTopFlagSet() (*flag.FlagSet, *topFlags) {
	fs := flag.NewFlagSet("rls top", flag.ContinueOnError)
	f := &topFlags{}
	fs.StringVar(&f.addr, "addr", defaultAdminAddr, "rls's HTTP `address` (host:port, or a URL); /debug/top answers loopback clients only by default")
	fs.StringVar(&f.tokenFile, "token-file", "", "a `file` holding the bearer token of rls's --admin-token-file (needed when rls runs with --admin-require-token)")
	fs.StringVar(&f.name, "name", "", "only the limit of this `name` (its label, as rls_decisions_total's limit)")
	fs.StringVar(&f.by, "by", "denied", "rank keys by `what`: denied or fullness")
	fs.IntVar(&f.n, "n", 10, "`keys` per limit")
	fs.DurationVar(&f.interval, "interval", 2*time.Second, "how often the view refreshes")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "bound on each request")
	fs.BoolVar(&f.once, "once", false, "print the view once, without clearing the screen, and exit")
	fs.BoolVar(&f.json, "json", false, "print GET /debug/top's JSON once, as it comes")
	return fs, f
}

func topDetails(w io.Writer) {
	fmt.Fprint(w, `Shows who is being limited: for each limit of DOMAIN (every domain when none is given), the
keys its current window denies most (or, with --by fullness, the fullest), merged over the rls
processes sharing the store, refreshed every --interval like top (Ctrl-C ends it). Each key
comes with the command line that resets it, and the heaviest with its rls explain and an rls
override set that blocks it for an hour (--json gives them for every key). It reads GET
/debug/top on rls's HTTP address.
Exit status: 0, 3 when the request failed (with --once or --json), 2 for a bad command line.

  rls top api
  rls top --by fullness --name remote_address/1m --once api

flags:
`)
	fs, _ := newTopFlagSet()
	printFlags(w, fs, nil, false)
}

// top shows a running rls's GET /debug/top.
func top(ctx context.Context, args []string, stdout io.Writer) error {
	fs, f := newTopFlagSet()
	if err := commandFlags("top", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	if fs.NArg() > 1 {
		return usageError{fmt.Errorf("top: want at most a DOMAIN (rls top --help)")}
	}
	if f.by != "denied" && f.by != "fullness" {
		return usageError{fmt.Errorf("top: --by %q is not denied or fullness", f.by)}
	}
	if f.n < 1 || f.interval <= 0 {
		return usageError{fmt.Errorf("top: -n and --interval must be positive")}
	}
	token, err := readToken("top", f.tokenFile)
	if err != nil {
		return err
	}
	q := url.Values{"by": {f.by}, "n": {strconv.Itoa(f.n)}}
	if fs.NArg() == 1 {
		q.Set("domain", fs.Arg(0))
	}
	if f.name != "" {
		q.Set("name", f.name)
	}
	path := "/debug/top?" + q.Encode()
	fetch := func() ([]byte, error) {
		c, cancel := context.WithTimeout(ctx, f.timeout)
		defer cancel()
		return callAdmin(c, "top", "GET", f.addr, path, token, nil)
	}
	if f.json {
		answer, err := fetch()
		if err != nil {
			return err
		}
		_, err = stdout.Write(answer)
		return err
	}
	for {
		answer, err := fetch()
		if ctx.Err() != nil {
			return nil
		}
		if !f.once {
			io.WriteString(stdout, "\x1b[H\x1b[2J") // home, clear the screen
		}
		fmt.Fprintf(stdout, "rls top  %s  %s  by %s\n", f.addr, time.Now().Format("15:04:05"), f.by)
		if err == nil {
			var res httpapi.TopResult
			if err = json.Unmarshal(answer, &res); err == nil {
				writeTop(stdout, &res, f.addr)
			} else {
				err = exitError{checkFailed, fmt.Errorf("top: the answer is not GET /debug/top's: %w", err)}
			}
		}
		if err != nil {
			if f.once {
				return err
			}
			fmt.Fprintf(stdout, "\n%v\n", err)
		}
		if f.once {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.interval):
		}
	}
}

// defaultAdminAddr is --addr's default in rls top, reset, explain and
// override: the command lines it prints name another one.
const defaultAdminAddr = "127.0.0.1:8080"

// writeTop writes one view of res, read from addr: each limit's keys with
// the command line that resets each, then what to run next for the
// heaviest (its explain and an override that blocks it for an hour).
func writeTop(w io.Writer, res *httpapi.TopResult, addr string) {
	if res.Processes == 1 {
		fmt.Fprint(w, "1 rls process")
	} else {
		fmt.Fprintf(w, "%d rls processes", res.Processes)
	}
	if res.Note != "" {
		fmt.Fprintf(w, " (%s)", res.Note)
	}
	fmt.Fprintln(w)
	for _, l := range res.Limits {
		limit := ""
		if l.RequestsPerUnit != nil {
			limit = fmt.Sprintf(", limit %d", *l.RequestsPerUnit)
		}
		// Windows are cut in UTC (a calendar window in its own zone, shown
		// in UTC too).
		fmt.Fprintf(w, "\n%s %s (%s%s), window %s to %s UTC: %d decisions, %d denied, error ≤ %d\n", l.Domain, l.Name, pathOf(l.Descriptor), limit,
			l.WindowStart.UTC().Format("15:04:05"), l.WindowEnd.UTC().Format("15:04:05"), l.Decisions, l.Denials, l.Error)
		if len(l.Keys) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  DENIED\tADMITTED\tFULL\tKEY\tRESET")
		for _, k := range l.Keys {
			reset := "-"
			if k.Commands != nil {
				reset = withAddr(k.Commands.Reset, addr)
			}
			fmt.Fprintf(tw, "  %d\t%d\t%.0f%%\t%s\t%s\n", k.Denied, k.Admitted, 100*k.Fullness, httpapi.DescriptorText(k.Descriptor), reset)
		}
		tw.Flush()
		if c := l.Keys[0].Commands; c != nil {
			fmt.Fprintf(w, "  explain:  %s\n  override: %s\n", withAddr(c.Explain, addr), withAddr(c.Override, addr))
		}
	}
}

// withAddr returns the command line cmd ("rls VERB ..." or "rls override
// set ...") with --addr addr after its verb when addr is not the default.
func withAddr(cmd, addr string) string {
	if addr == defaultAdminAddr {
		return cmd
	}
	verb := "rls " + strings.Fields(cmd)[1]
	if verb == "rls override" {
		verb += " set"
	}
	return verb + " --addr " + httpapi.ShellQuote(addr) + strings.TrimPrefix(cmd, verb)
}

// pathOf writes a config path: key or key=value per level, by '/'.
func pathOf(p []httpapi.EntryJSON) string {
	var parts []string
	for _, e := range p {
		if e.Value == "" {
			parts = append(parts, e.Key)
		} else {
			parts = append(parts, e.Key+"="+e.Value)
		}
	}
	return strings.Join(parts, "/")
}
