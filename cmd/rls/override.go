package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/overrides"
)

// overrideFlags are rls override's flags (each subcommand takes those it
// needs).
type overrideFlags struct {
	addr, tokenFile string
	timeout         time.Duration
	json            bool
	name            string
	rpu             string // --requests-per-unit, checked when set
	burst           string
	ttl             string
	reason          string
}

// newOverrideFlagSet defines the flags of rls override sub.
func newOverrideFlagSet(sub string) (*flag.FlagSet, *overrideFlags) {
	fs := flag.NewFlagSet("rls override "+sub, flag.ContinueOnError)
	f := &overrideFlags{}
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "rls's HTTP `address` (host:port, or a URL)")
	fs.StringVar(&f.tokenFile, "token-file", "", "a `file` holding the bearer token of rls's --admin-token-file (needed off loopback, and from loopback too when rls runs with --admin-require-token)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "bound on the request")
	fs.BoolVar(&f.json, "json", false, "print the JSON answer as it comes")
	if sub == "list" {
		return fs, f
	}
	fs.StringVar(&f.name, "name", "", "the `name` of the one limit of the descriptor to override (default: every limit of its node)")
	if sub == "delete" {
		return fs, f
	}
	fs.StringVar(&f.rpu, "requests-per-unit", "", "the new requests_per_unit (`N`; 0 blocks every request); required")
	fs.StringVar(&f.burst, "burst", "", "the new burst of token_bucket limits (`N`; default: --requests-per-unit)")
	fs.StringVar(&f.ttl, "ttl", "", "make the override end by itself after this `duration` (2h, 90m), by the store's clock")
	fs.StringVar(&f.reason, "reason", "", "why (free `text`, shown in the list, /debug/explain and the log)")
	return fs, f
}

func overrideDetails(w io.Writer) {
	fmt.Fprint(w, `Sets, lists and deletes runtime overrides of a running rls's limits (PUT, GET and DELETE
/admin/overrides on its HTTP address). An override gives the limits of a descriptor another
requests_per_unit (and burst) on the same counters, in every decision of every rls sharing
the store within a second, until it is deleted or its --ttl ends it. The descriptor is
KEY=VALUE arguments, one per entry, in the order of the config's tree; a VALUE ending in '*'
covers every value with that prefix (an exact value beats a prefix, a longer prefix a shorter
one). An override that matches no limit of the loaded config is refused. Flags may follow
the arguments. Access as rls reset: loopback, or the bearer token of --admin-token-file.
Exit status: 0 when rls did it, 3 when the request failed (4 for delete: none such), 2 for a
bad command line.

  rls override set api tenant=acme --requests-per-unit 5000 --reason "plan: enterprise"
  rls override set api tenant=acme --name daily --requests-per-unit 50000 --ttl 2h --reason migration
  rls override set api tenant=abuser-* --requests-per-unit 0
  rls override list api
  rls override delete api tenant=acme --name daily

set flags:
`)
	fs, _ := newOverrideFlagSet("set")
	printFlags(w, fs, nil, false)
}

// overrideNotFound is the exit status of a delete of no override.
const overrideNotFound = 4

// override runs rls override SUB.
func override(ctx context.Context, args []string, stdout io.Writer) error {
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "set", "list", "delete":
	default:
		fs, _ := newOverrideFlagSet("list")
		if err := commandFlags("override", fs, args, stdout); err != nil {
			return helpIsSuccess(err)
		}
		return usageError{fmt.Errorf("override: want set, list or delete (rls override --help)")}
	}
	fs, f := newOverrideFlagSet(sub)
	pos, err := interspersed("override", fs, args, stdout)
	if err != nil {
		return helpIsSuccess(err)
	}
	token, err := readToken("override", f.tokenFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	switch sub {
	case "list":
		return f.list(ctx, pos, token, stdout)
	case "delete":
		return f.delete(ctx, pos, token, stdout)
	}
	return f.set(ctx, pos, token, stdout)
}

// interspersed parses args with fs, flags before, between and after the
// positional arguments, which it returns.
func interspersed(name string, fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := commandFlags(name, fs, args, stdout); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// key reads DOMAIN KEY=VALUE... and --name.
func (f *overrideFlags) key(cmd string, pos []string) (overrides.Key, error) {
	if len(pos) < 2 {
		return overrides.Key{}, usageError{fmt.Errorf("override %s: want DOMAIN KEY=VALUE... (rls override --help)", cmd)}
	}
	k := overrides.Key{Domain: pos[0], Name: f.name}
	for _, kv := range pos[1:] {
		key, value, ok := strings.Cut(kv, "=")
		if !ok || key == "" {
			return overrides.Key{}, usageError{fmt.Errorf("override %s: %q is not KEY=VALUE", cmd, kv)}
		}
		k.Descriptor = append(k.Descriptor, engine.Entry{Key: key, Value: value})
	}
	return k, nil
}

// body is the JSON of k (and the values, for set) as /admin/overrides
// takes it.
func (f *overrideFlags) body(k overrides.Key, set bool) ([]byte, error) {
	desc := make([]overrides.EntryJSON, len(k.Descriptor))
	for i, e := range k.Descriptor {
		desc[i] = overrides.EntryJSON(e)
	}
	b := map[string]any{"domain": k.Domain, "descriptor": desc}
	if k.Name != "" {
		b["name"] = k.Name
	}
	if set {
		if f.rpu == "" {
			return nil, usageError{errors.New("override set: --requests-per-unit is required (0 blocks every request)")}
		}
		var rpu uint32
		if _, err := fmt.Sscan(f.rpu, &rpu); err != nil {
			return nil, usageError{fmt.Errorf("override set: --requests-per-unit: %q is not a number from 0 to 4294967295", f.rpu)}
		}
		b["requests_per_unit"] = rpu
		if f.burst != "" {
			var burst uint32
			if _, err := fmt.Sscan(f.burst, &burst); err != nil {
				return nil, usageError{fmt.Errorf("override set: --burst: %q is not a number from 0 to 4294967295", f.burst)}
			}
			b["burst"] = burst
		}
		if f.ttl != "" {
			if _, err := overrides.ParseTTL(f.ttl); err != nil {
				return nil, usageError{fmt.Errorf("override set: --%w", err)}
			}
			b["ttl"] = f.ttl
		}
		if f.reason != "" {
			b["reason"] = f.reason
		}
	}
	return json.Marshal(b)
}

func (f *overrideFlags) set(ctx context.Context, pos []string, token string, stdout io.Writer) error {
	k, err := f.key("set", pos)
	if err != nil {
		return err
	}
	body, err := f.body(k, true)
	if err != nil {
		return err
	}
	answer, err := callAdmin(ctx, "override set", http.MethodPut, f.addr, "/admin/overrides", token, body)
	if err != nil {
		return err
	}
	var l overrides.Listed
	if done, err := readAnswer("override set", "an override", answer, f.json, stdout, &l); done || err != nil {
		return err
	}
	writeOverrides(stdout, []overrides.Listed{l}, time.Now())
	return nil
}

func (f *overrideFlags) delete(ctx context.Context, pos []string, token string, stdout io.Writer) error {
	k, err := f.key("delete", pos)
	if err != nil {
		return err
	}
	body, err := f.body(k, false)
	if err != nil {
		return err
	}
	answer, err := callAdmin(ctx, "override delete", http.MethodDelete, f.addr, "/admin/overrides", token, body)
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) && strings.Contains(err.Error(), "404 Not Found") {
			return exitError{overrideNotFound, err}
		}
		return err
	}
	if f.json {
		_, err := stdout.Write(answer)
		return err
	}
	fmt.Fprintf(stdout, "deleted %s\n", k)
	return nil
}

func (f *overrideFlags) list(ctx context.Context, pos []string, token string, stdout io.Writer) error {
	if len(pos) > 1 {
		return usageError{errors.New("override list: want [DOMAIN]")}
	}
	path := "/admin/overrides"
	if len(pos) == 1 {
		path += "?domain=" + url.QueryEscape(pos[0])
	}
	answer, err := callAdmin(ctx, "override list", http.MethodGet, f.addr, path, token, nil)
	if err != nil {
		return err
	}
	var list struct {
		Overrides []overrides.Listed `json:"overrides"`
	}
	if done, err := readAnswer("override list", "a list of overrides", answer, f.json, stdout, &list); done || err != nil {
		return err
	}
	if len(list.Overrides) == 0 {
		fmt.Fprintln(stdout, "no overrides")
		return nil
	}
	writeOverrides(stdout, list.Overrides, time.Now())
	return nil
}

// writeOverrides prints overrides as a table, their expiries from now.
func writeOverrides(w io.Writer, list []overrides.Listed, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tDESCRIPTOR\tLIMIT\tREQUESTS_PER_UNIT\tEXPIRES\tSTATE\tREASON")
	for _, l := range list {
		desc := make([]string, len(l.Descriptor))
		for i, e := range l.Descriptor {
			desc[i] = e.Key + "=" + e.Value
		}
		name := l.Name
		if name == "" {
			name = "*"
		}
		rpu := fmt.Sprint(l.RequestsPerUnit)
		if l.Burst != nil {
			rpu += fmt.Sprintf(" (burst %d)", *l.Burst)
		}
		expires := "never"
		if l.ExpiresAt != nil {
			expires = fmt.Sprintf("%s (in %s)", l.ExpiresAt.Format(time.RFC3339), l.ExpiresAt.Sub(now).Round(time.Second))
		}
		state := "active: " + strings.Join(l.Limits, ", ")
		if !l.Active {
			state = "inactive"
			if len(l.Problems) > 0 {
				state += ": " + l.Problems[0]
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Domain, strings.Join(desc, ","), name, rpu, expires, state, l.Reason)
	}
	tw.Flush()
}
