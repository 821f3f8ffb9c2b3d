package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rlsproject/rls/internal/httpapi"
)

// explainFlags are rls explain's flags.
type explainFlags struct {
	addr      string
	tokenFile string
	hits      uint
	timeout   time.Duration
	json      bool
	// The HTTP form: any of these set asks with the domain's
	// http_descriptors instead of DESCRIPTOR arguments.
	method, path, authority, client string
	headers                         headerFlags
}

// headerFlags collects repeated --header 'name: value' flags.
type headerFlags map[string]string

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("%q is not 'name: value'", s)
	}
	h[strings.ToLower(strings.TrimSpace(name))] = strings.TrimSpace(value)
	return nil
}

func newExplainFlagSet() (*flag.FlagSet, *explainFlags) {
	fs := flag.NewFlagSet("rls explain", flag.ContinueOnError)
	f := &explainFlags{headers: headerFlags{}}
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "rls's HTTP `address` (host:port, or a URL); /debug/explain answers loopback clients only by default")
	fs.StringVar(&f.tokenFile, "token-file", "", "a `file` holding the bearer token of rls's --admin-token-file (needed when rls runs with --admin-require-token)")
	fs.UintVar(&f.hits, "hits", 0, "the `hits` of the request (hits_addend; 0 counts as 1)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "bound on the request")
	fs.BoolVar(&f.json, "json", false, "print the JSON answer as it comes")
	fs.StringVar(&f.method, "method", "", "HTTP form: the request's `method`")
	fs.StringVar(&f.path, "path", "", "HTTP form: the request's `path`, with its query string")
	fs.StringVar(&f.authority, "authority", "", "HTTP form: the request's `host`")
	fs.StringVar(&f.client, "client", "", "HTTP form: the client's IP `address`")
	fs.Var(f.headers, "header", "HTTP form: a request header, `name: value` (repeat the flag for more)")
	return fs, f
}

func explainDetails(w io.Writer) {
	fmt.Fprint(w, `Asks a running rls (POST /debug/explain on its HTTP address) how it would answer the
RateLimitRequest of DOMAIN with one descriptor per DESCRIPTOR argument, written
key=value[,key=value...] as for rls check, or, with --method, --path, --header or --client
and no DESCRIPTOR, the HTTP request that the domain's http_descriptors turn into descriptors
(as /auth and ext_authz do). Prints, per descriptor, the config node it matched, or where and
why matching stopped, then each of its limits: enforced, shadow, unlimited or replaced, with
what it has left and when it resets. Nothing is consumed. Exit status: 0 when rls answered,
3 when the request failed, 2 for a bad command line.

  rls explain api remote_address=203.0.113.7 tenant=acme,plan=gold
  rls explain --path /api/v1/users --header 'x-api-key: k1' --client 203.0.113.7 api

flags:
`)
	fs, _ := newExplainFlagSet()
	printFlags(w, fs, nil, false)
}

// explain asks a running rls's /debug/explain and prints the answer.
func explain(ctx context.Context, args []string, stdout io.Writer) error {
	fs, f := newExplainFlagSet()
	if err := commandFlags("explain", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	body, err := f.body(fs.Args())
	if err != nil {
		return usageError{fmt.Errorf("explain: %w (rls explain --help)", err)}
	}
	token, err := readToken("explain", f.tokenFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	answer, err := postAdmin(ctx, "explain", f.addr, "/debug/explain", token, body)
	if err != nil {
		return err
	}
	var ex httpapi.Explanation
	if done, err := readAnswer("explain", "an explanation", answer, f.json, stdout, &ex); done || err != nil {
		return err
	}
	writeExplanation(stdout, &ex, time.Now())
	return nil
}

// readAnswer hands a command's answer over: with raw (--json), written to
// stdout as it came (done); otherwise decoded into v, an answer that is not
// what (a JSON of its kind) failing the command (exit status checkFailed).
func readAnswer(cmd, what string, answer []byte, raw bool, stdout io.Writer, v any) (done bool, err error) {
	if raw {
		_, err := stdout.Write(answer)
		return true, err
	}
	if err := json.Unmarshal(answer, v); err != nil {
		return false, exitError{checkFailed, fmt.Errorf("%s: the answer is not %s: %w", cmd, what, err)}
	}
	return false, nil
}

// readToken reads the bearer token of a --token-file (none when path is
// empty) as rls reads its --admin-token-file: one non-empty line.
func readToken(cmd, path string) (string, error) {
	if path == "" {
		return "", nil
	}
	token, err := httpapi.ReadTokenFile(path)
	if err != nil {
		return "", usageError{fmt.Errorf("%s: --token-file: %w", cmd, err)}
	}
	return string(token), nil
}

// postAdmin posts body to path on rls's HTTP address addr (host:port, or
// a URL), with the bearer token when there is one, and returns the answer
// of a 200; other outcomes are the command's errors (usage, or exit status
// checkFailed).
func postAdmin(ctx context.Context, cmd, addr, path, token string, body []byte) ([]byte, error) {
	return callAdmin(ctx, cmd, http.MethodPost, addr, path, token, body)
}

// callAdmin is postAdmin with another method (body nil: none).
func callAdmin(ctx context.Context, cmd, method, addr, path, token string, body []byte) ([]byte, error) {
	url := addr
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	url = strings.TrimSuffix(url, "/") + path
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, usageError{fmt.Errorf("%s: --addr: %w", cmd, err)}
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, exitError{checkFailed, fmt.Errorf("%s: %w", cmd, err)}
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, exitError{checkFailed, fmt.Errorf("%s: reading the answer: %w", cmd, err)}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, exitError{checkFailed, fmt.Errorf("%s: %s: %s", cmd, resp.Status, strings.TrimSpace(string(answer)))}
	}
	return answer, nil
}

// body builds the JSON body of the arguments DOMAIN [DESCRIPTOR...].
func (f *explainFlags) body(args []string) ([]byte, error) {
	httpForm := f.method != "" || f.path != "" || f.authority != "" || f.client != "" || len(f.headers) > 0
	switch {
	case len(args) == 0:
		return nil, errors.New("want DOMAIN")
	case httpForm && len(args) > 1:
		return nil, errors.New("the HTTP form (--method, --path, --authority, --header, --client) takes DOMAIN only")
	case httpForm && f.hits != 0:
		return nil, errors.New("--hits: an HTTP request counts 1 hit per descriptor")
	case httpForm:
		return json.Marshal(map[string]any{"domain": args[0], "http": map[string]any{
			"method": f.method, "path": f.path, "authority": f.authority, "headers": f.headers, "client_address": f.client,
		}})
	}
	c := checkFlags{n: 1, hits: f.hits}
	req, err := c.request(args)
	if err != nil {
		return nil, err
	}
	return protojson.Marshal(req)
}

// writeExplanation prints ex, received at now, for people, e.g.
//
//	api: OVER_LIMIT if it came now
//	descriptor 0 remote_address=203.0.113.7, 1 hit: matched "remote_address" (config/limits.yaml:34:5)
//	  remote_address/1s    10/second fixed_window      enforced   remaining 0, reset 1s: denies
//
// A limit with a penalty has a line of its own under it: the ladder, and
// the block in force.
func writeExplanation(w io.Writer, ex *httpapi.Explanation, now time.Time) {
	switch {
	case ex.StoreError != "":
		fmt.Fprintf(w, "%s: the limits' state could not be read: %s\n", ex.Domain, ex.StoreError)
	case ex.Never:
		fmt.Fprintf(w, "%s: %s if it came now, and it never passes as it is (more hits than a limit holds)\n", ex.Domain, ex.Code)
	default:
		fmt.Fprintf(w, "%s: %s if it came now\n", ex.Domain, ex.Code)
	}
	for _, it := range ex.HTTPDescriptors {
		if it.Dropped != nil {
			what := it.Dropped.Reason
			if it.Dropped.Kind != "" {
				what = fmt.Sprintf("action %d (%s): %s", it.Dropped.Action, it.Dropped.Kind, it.Dropped.Reason)
			}
			fmt.Fprintf(w, "http_descriptors[%d] (%s): no descriptor: %s\n", it.Index, it.At, what)
			continue
		}
		fmt.Fprintf(w, "http_descriptors[%d] (%s): descriptor %d\n", it.Index, it.At, *it.Descriptor)
	}
	for i, de := range ex.Descriptors {
		var entries []string
		for _, e := range de.Entries {
			entries = append(entries, e.Key+"="+e.Value)
		}
		hits := fmt.Sprintf("%d hits", de.Hits)
		switch {
		case de.Refund:
			hits = fmt.Sprintf("%d hits given back", de.Hits)
		case de.Hits == 1:
			hits = "1 hit"
		}
		fmt.Fprintf(w, "descriptor %d %s, %s: %s\n", i, strings.Join(entries, ","), hits, de.Match.Message)
		for _, l := range de.Limits {
			fmt.Fprintf(w, "  %s\n", limitLine(l))
			if p := penaltyLine(l, now); p != "" {
				fmt.Fprintf(w, "    %s\n", p)
			}
			if o := overrideLine(l, now); o != "" {
				fmt.Fprintf(w, "    %s\n", o)
			}
			if r := reserveLine(l); r != "" {
				fmt.Fprintf(w, "    %s\n", r)
			}
		}
	}
}

// overrideLine says the runtime override in force on a limit as rls
// explain prints it under the limit, "" when none is, e.g.
//
//	override of tenant=acme-*: 500 instead of the config's 10, until 2025-03-01T14:00:00Z (in 2h0m0s): migration
func overrideLine(l httpapi.LimitExplanation, now time.Time) string {
	o := l.Override
	if o == nil {
		return ""
	}
	var b strings.Builder
	desc := make([]string, len(o.Descriptor))
	for i, e := range o.Descriptor {
		desc[i] = e.Key + "=" + e.Value
	}
	fmt.Fprintf(&b, "override of %s", strings.Join(desc, ","))
	if o.Name != "" {
		fmt.Fprintf(&b, " (%s)", o.Name)
	}
	fmt.Fprintf(&b, ": %d instead of the config's %d", o.RequestsPerUnit, o.Configured.RequestsPerUnit)
	if o.Burst != nil {
		fmt.Fprintf(&b, ", burst %d instead of %d", *o.Burst, o.Configured.Burst)
	}
	if o.ExpiresAt != nil {
		fmt.Fprintf(&b, ", until %s (in %s)", o.ExpiresAt.UTC().Format(time.RFC3339), o.ExpiresAt.Sub(now).Round(time.Second))
	}
	if o.Reason != "" {
		fmt.Fprintf(&b, ": %s", o.Reason)
	}
	return b.String()
}

// reserveCalls says what a reservation call would do, by the name
// /debug/explain gives it.
var reserveCalls = map[string]string{
	"none":          "this call has no request id: it neither reserves nor settles",
	"reserve":       "this call would reserve",
	"settle":        "this call would settle its hold",
	"settled_again": "this call would settle again: nothing charged",
	"settle_unheld": "this call's hold ended by itself: its hits would be charged",
}

// reserveLine says a limit's reserve as rls explain prints it under the
// limit, "" for a limit that does not reserve: the estimate and ttl, what
// its counter holds, and what this call would do, e.g.
//
//	reserve 4000 for 5m0s: 8000 held by 2 reservations, the oldest 30s old; this call would settle its hold
func reserveLine(l httpapi.LimitExplanation) string {
	r := l.Reserve
	if r == nil {
		return ""
	}
	line := fmt.Sprintf("reserve %d for %s", r.Estimate, r.TTL)
	if l.State == nil {
		return line
	}
	switch {
	case r.Holds == 0:
		line += ": nothing held"
	case r.Holds == 1:
		line += fmt.Sprintf(": %d held by 1 reservation, %s old", r.Held, r.OldestHold)
	default:
		line += fmt.Sprintf(": %d held by %d reservations, the oldest %s old", r.Held, r.Holds, r.OldestHold)
	}
	if c, ok := reserveCalls[r.Call]; ok {
		line += "; " + c
	}
	return line
}

// penaltyLine says a limit's penalty as rls explain prints it under the
// limit, "" for a limit without one: the ladder, when it starts over, and
// the block in force with its end (now plus what is left of it), e.g.
//
//	penalty 2m0s, 10m0s, 1h0m0s, starting over after 24h0m0s without a denial; blocked for 2m0s, until 2025-03-01T12:02:00Z: every request denied
func penaltyLine(l httpapi.LimitExplanation, now time.Time) string {
	if len(l.Penalty) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "penalty %s", strings.Join(l.Penalty, ", "))
	if l.PenaltyReset != "" {
		fmt.Fprintf(&b, ", starting over after %s without a denial", l.PenaltyReset)
	}
	if s := l.State; s != nil && s.BlockedFor != "" {
		fmt.Fprintf(&b, "; blocked for %s", s.BlockedFor)
		if d, err := time.ParseDuration(s.BlockedFor); err == nil {
			fmt.Fprintf(&b, ", until %s", now.Add(d).UTC().Format(time.RFC3339))
		}
		b.WriteString(": every request denied")
	}
	return b.String()
}

// limitLine is one limit of a descriptor as rls explain prints it.
func limitLine(l httpapi.LimitExplanation) string {
	var b strings.Builder
	if l.Unlimited {
		fmt.Fprintf(&b, "%-28s %-32s %s", l.Label, "unlimited", l.Applies)
		return b.String()
	}
	rate := fmt.Sprintf("%d/%s", l.RequestsPerUnit, l.Unit)
	if l.UnitMultiplier > 1 {
		rate = fmt.Sprintf("%d/%d%ss", l.RequestsPerUnit, l.UnitMultiplier, l.Unit)
	}
	alg := l.Algorithm
	if l.Burst > 0 {
		alg += fmt.Sprintf(" burst %d", l.Burst)
	}
	if l.LeaseTTL != "" {
		rate, alg = fmt.Sprintf("%d in flight", l.RequestsPerUnit), alg+" lease_ttl "+l.LeaseTTL
	}
	fmt.Fprintf(&b, "%-28s %-32s %s", l.Label, rate+" "+alg, l.Applies)
	if len(l.ReplacedBy) > 0 {
		fmt.Fprintf(&b, " by %s", strings.Join(l.ReplacedBy, ", "))
	}
	if s := l.State; s != nil {
		reset := s.Reset
		if d, err := time.ParseDuration(s.Reset); err == nil && d > time.Second {
			reset = d.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, ": remaining %d, reset %s", s.Remaining, reset)
		switch {
		case s.Never:
			b.WriteString(", never admits these hits")
		case !s.Admits && l.Applies == "shadow":
			b.WriteString(", would deny (shadow)")
		case !s.Admits:
			b.WriteString(", denies")
		}
	}
	return b.String()
}
