package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// command is one subcommand, as the help shows it.
type command struct {
	name     string
	synopsis string // after "rls "
	summary  string // one line
	// details is the rest of the command's own help (rls help NAME, rls
	// NAME --help); nil when the summary says all.
	details func(w io.Writer)
}

// commands are rls's subcommands, in the order of the help.
var commands = []command{
	{"serve", "[serve] [flags]", "serve the rate-limit APIs (gRPC and HTTP); plain `rls` serves too", serveDetails},
	{"validate", "validate PATH...", "check config files or directories, change nothing; exit 1 and one path:line:col line per problem", validateDetails},
	{"check", "check [flags] DOMAIN DESCRIPTOR...", "ask a running rls over one gRPC connection, one line per answer; exit 1 when an answer is OVER_LIMIT", checkDetails},
	{"explain", "explain [flags] DOMAIN [DESCRIPTOR...]", "ask a running rls what each descriptor matches (or why not), its limits and their state, consuming nothing", explainDetails},
	{"reset", "reset [flags] DOMAIN DESCRIPTOR...", "ask a running rls to clear the counters of the limits the descriptors match (POST /admin/reset)", resetDetails},
	{"override", "override set|list|delete ...", "set, list and delete runtime overrides of a running rls's limits (/admin/overrides)", overrideDetails},
	{"test", "test CONFIG TESTFILE...", "run the cases of TESTFILEs against CONFIG on a virtual clock; PASS or FAIL per case, exit 1 on a failure", testDetails},
	{"top", "top [flags] [DOMAIN]", "show who is being limited: each limit's most denied (or fullest) keys, refreshed like top (GET /debug/top)", topDetails},
	{"replay", "replay --config CANDIDATE [--baseline CONFIG] LOG...", "replay decision logs against a candidate config: per limit, what it admits and denies against the baseline", replayDetails},
	{"healthcheck", "healthcheck [flags] [URL]", "exit 0 when URL (default http://127.0.0.1:8080/readyz) answers 200, for container health checks (HTTPS and mutual TLS too)", healthcheckDetails},
	{"version", "version", "print the version, commit and Go version (also rls --version)", nil},
	{"help", "help [COMMAND]", "this help, or a command's (also rls COMMAND --help)", nil},
}

// help prints the help of the command args names, or the whole help: every
// command, then serve's flags.
func help(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rls help", flag.ContinueOnError)
	if err := commandFlags("help", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	args = fs.Args()
	switch len(args) {
	case 0:
		fmt.Fprint(stdout, "rls is a rate-limit server for Envoy (RateLimitService v3, ext_authz) and nginx (auth_request).\n\nusage:\n")
		for _, c := range commands {
			fmt.Fprintf(stdout, "  rls %-38s %s\n", c.synopsis, c.summary)
		}
		fmt.Fprintln(stdout)
		serveDetails(stdout)
		return nil
	case 1:
		for _, c := range commands {
			if c.name == args[0] {
				commandHelp(stdout, c)
				return nil
			}
		}
		return usageError{fmt.Errorf("help: unknown command %q", args[0])}
	}
	return usageError{errors.New("usage: rls help [COMMAND]")}
}

// commandHelp prints c's own help.
func commandHelp(w io.Writer, c command) {
	fmt.Fprintf(w, "usage: rls %s\n\n%s.\n", c.synopsis, upperFirst(c.summary))
	if c.details != nil {
		fmt.Fprintln(w)
		c.details(w)
	}
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// commandFlags parses args with fs for command name: on -h or --help it
// prints the command's help on stdout and returns flag.ErrHelp; a bad flag
// is a usageError.
func commandFlags(name string, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		for _, c := range commands {
			if c.name == name {
				commandHelp(stdout, c)
			}
		}
		return err
	}
	if err != nil {
		return usageError{fmt.Errorf("%s: %w (rls %s --help)", name, err, name)}
	}
	return nil
}

// serveFlagGroups order serve's flags in the help; every flag is in one.
var serveFlagGroups = []struct {
	title string
	flags []string
}{
	{"Config", []string{"config", "watch", "config-max-file-bytes", "config-max-total-bytes"}},
	{"Listeners", []string{"grpc-addr", "http-addr", "tls-cert", "tls-key", "tls-client-ca", "tls-listeners", "trusted-proxies", "debug-endpoints", "admin-token-file", "admin-require-token", "ui"}},
	{"Store", []string{"store", "memory-limit", "store-timeout", "on-store-error", "redis-url", "redis-cluster", "redis-sentinel", "redis-sentinel-user", "redis-sentinel-password", "redis-prefix", "redis-ca", "redis-cert", "redis-key", "redis-tls-skip-hostname", "redis-pool-size",
		"redis-per-second-url", "redis-per-second-cluster", "redis-per-second-sentinel", "redis-per-second-sentinel-user", "redis-per-second-sentinel-password", "deny-cache", "overrides-file"}},
	{"Answers and metrics", []string{"response-headers", "shadow", "metrics-max-values"}},
	{"Who is limited, and what if", []string{"top-keys", "top-keys-publish", "decision-log", "decision-log-sample", "decision-log-hash-key", "decision-log-max-size", "decision-log-backups", "decision-log-queue"}},
	{"Bounds on what clients hold", []string{"http-max-connections", "http-read-timeout", "http-write-timeout", "http-idle-timeout", "grpc-max-streams", "grpc-max-connection-age", "grpc-max-connection-age-grace"}},
	{"Process", []string{"shutdown-timeout", "log-level", "log-format", "otlp-endpoint", "otlp-insecure"}},
	{"envoyproxy/ratelimit", []string{"compat", "count-denied-hits", "reference-stats"}},
}

func serveDetails(w io.Writer) {
	fmt.Fprint(w, `serve flags. Each flag can also be set with its RLS_ variable (upper case, - becomes _);
the command line wins, and an empty variable counts as unset. SIGHUP reloads the config;
SIGTERM and SIGINT drain in-flight requests and exit 0.
`)
	fs, _ := newServeFlagSet()
	for _, g := range serveFlagGroups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		printFlags(w, fs, g.flags, true)
	}
}

func validateDetails(w io.Writer) {
	fmt.Fprint(w, `Each PATH is a YAML file or a directory whose *.yaml/*.yml files are all loaded, as
rls serve --config loads them. Prints one line per domain when every file is valid. A path
that starts with - goes after --: rls validate -- -odd.yaml
`)
}

// printFlags writes, for each flag of fs named in names (nil: every flag,
// in order), a line with the flag, its argument, its RLS_ variable (when
// env) and its default, then its help, indented.
func printFlags(w io.Writer, fs *flag.FlagSet, names []string, env bool) {
	if names == nil {
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	}
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			panic("help: no flag " + name) // a programmer error, caught by the tests
		}
		arg, usage := flag.UnquoteUsage(f)
		head := "  --" + f.Name
		if len(f.Name) == 1 {
			head = "  -" + f.Name
		}
		if isBool(f) {
			head += "[=true|false]"
		} else if arg != "" {
			head += " " + arg
		}
		var notes []string
		if env {
			notes = append(notes, envName(f.Name))
		}
		if f.DefValue != "" {
			notes = append(notes, "default "+f.DefValue)
		}
		if len(notes) > 0 {
			head = fmt.Sprintf("%-40s (%s)", head, strings.Join(notes, ", "))
		}
		fmt.Fprintln(w, head)
		for _, line := range wrap(usage, 88) {
			fmt.Fprintln(w, "        "+line)
		}
	}
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// wrap breaks s into lines of at most width bytes at spaces (a longer word
// keeps a line of its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
