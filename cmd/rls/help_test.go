package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
)

// TestHelp: rls help, rls --help and rls -h print, on stdout, every command
// and every serve flag with its RLS_ variable and default.
func TestHelp(t *testing.T) {
	fs, _ := newServeFlagSet()
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}, {"-help"}} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, nil, &stdout, &stderr); err != nil {
			t.Fatalf("rls %v = %v, want success", args, err)
		}
		out := stdout.String()
		if stderr.Len() != 0 {
			t.Errorf("rls %v wrote on stderr: %q", args, stderr.String())
		}
		for _, c := range commands {
			if !strings.Contains(out, "rls "+c.synopsis) {
				t.Errorf("rls %v does not show the command %q", args, c.synopsis)
			}
		}
		fs.VisitAll(func(f *flag.Flag) {
			line := ""
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "  --"+f.Name+" ") || strings.HasPrefix(l, "  --"+f.Name+"[") {
					line = l
				}
			}
			if !strings.Contains(line, envName(f.Name)) || (f.DefValue != "" && !strings.Contains(line, "default "+f.DefValue)) {
				t.Errorf("rls %v: the line of --%s is %q, want its variable %s and default %q", args, f.Name, line, envName(f.Name), f.DefValue)
			}
		})
	}
}

// TestServeFlagGroups: the help shows every serve flag once.
func TestServeFlagGroups(t *testing.T) {
	fs, _ := newServeFlagSet()
	seen := map[string]int{}
	for _, g := range serveFlagGroups {
		for _, name := range g.flags {
			seen[name]++
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if seen[f.Name] != 1 {
			t.Errorf("--%s is in %d help groups, want 1", f.Name, seen[f.Name])
		}
		if strings.TrimSpace(f.Usage) == "" {
			t.Errorf("--%s has no help text", f.Name)
		}
		delete(seen, f.Name)
	})
	for name := range seen {
		t.Errorf("help group names %q, which is no flag", name)
	}
}

// TestCommandHelp: every command answers --help and -h with its own help on
// stdout and success; validate no longer takes --help for a file.
func TestCommandHelp(t *testing.T) {
	for _, c := range commands {
		for _, args := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {"help", c.name}} {
			var stdout, stderr bytes.Buffer
			if err := run(context.Background(), args, nil, &stdout, &stderr); err != nil {
				t.Errorf("rls %v = %v, want success", args, err)
				continue
			}
			if want := "usage: rls " + c.synopsis + "\n"; !strings.HasPrefix(stdout.String(), want) || stderr.Len() != 0 {
				t.Errorf("rls %v printed %q on stdout and %q on stderr, want %q first on stdout", args, stdout.String(), stderr.String(), want)
			}
		}
	}
	var stdout bytes.Buffer
	run(context.Background(), []string{"serve", "--help"}, nil, &stdout, io.Discard)
	if !strings.Contains(stdout.String(), "RLS_GRPC_MAX_STREAMS") {
		t.Errorf("rls serve --help lacks the flags:\n%s", stdout.String())
	}
	if err := run(context.Background(), []string{"help", "frobnicate"}, nil, io.Discard, io.Discard); exitCode(err) != 2 {
		t.Errorf("rls help frobnicate: exit %d, want 2", exitCode(err))
	}
	if err := run(context.Background(), []string{"validate", "--bogus"}, nil, io.Discard, io.Discard); exitCode(err) != 2 || !strings.Contains(err.Error(), "rls validate --help") {
		t.Errorf("rls validate --bogus = %v (exit %d), want exit 2 pointing at the help", err, exitCode(err))
	}
}

// TestVersionFlag: rls --version prints what rls version prints.
func TestVersionFlag(t *testing.T) {
	var a, b bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, nil, &a, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"version"}, nil, &b, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.String(), "rls ") || a.String() != b.String() {
		t.Errorf("rls --version printed %q, rls version %q; want the same, starting with \"rls \"", a.String(), b.String())
	}
	if err := run(context.Background(), []string{"version", "extra"}, nil, io.Discard, io.Discard); exitCode(err) != 2 {
		t.Errorf("rls version extra: exit %d, want 2", exitCode(err))
	}
}

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		in    string
		width int
		want  []string
	}{
		{"", 10, nil},
		{"a b c", 3, []string{"a b", "c"}},
		{"abcdefghij k", 4, []string{"abcdefghij", "k"}},
		{"one  two\nthree", 80, []string{"one two three"}},
	} {
		if got := wrap(tc.in, tc.width); strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.in, tc.width, got, tc.want)
		}
	}
}

// The help of --debug-endpoints names every endpoint it gates: it left out
// /debug/explain, which README's table names.
func TestDebugEndpointsHelpNamesExplain(t *testing.T) {
	fs, _ := newServeFlagSet()
	usage := fs.Lookup("debug-endpoints").Usage
	for _, path := range []string{"/debug/config", "/debug/explain", "/debug/pprof"} {
		if !strings.Contains(usage, path) {
			t.Errorf("--debug-endpoints help %q does not name %s", usage, path)
		}
	}
}
