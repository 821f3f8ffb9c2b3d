package e2e_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
}

// parseDockerfile splits a Dockerfile into instructions; comments, parser
// directives and blank lines are dropped.
func parseDockerfile(data []byte) []instruction {
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " ")})
		cur.Reset()
	}
	return out
}

// execForm decodes an exec-form argument list (["a", "b"]).
func execForm(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		t.Errorf("%s: not in exec form: %v", s, err)
	}
	return out
}

// goVersion returns go.mod's go directive as major.minor ("1.26").
func goVersion(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(readFile(t, filepath.Join(root, "go.mod")))
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

// TestDockerfile checks what the image promises and what
// docker-compose.yaml relies on, without building it: the Go release of
// go.mod, a static nonroot binary at /rls with its version stamped, the
// example config where CMD reads it, the health check.
func TestDockerfile(t *testing.T) {
	var froms, users, copies, runs, exposes, healthchecks, entrypoints, cmds []string
	for _, in := range parseDockerfile(readFile(t, filepath.Join(root, "Dockerfile"))) {
		switch in.cmd {
		case "FROM":
			froms = append(froms, in.args)
		case "USER":
			users = append(users, in.args)
		case "COPY":
			copies = append(copies, in.args)
		case "RUN":
			runs = append(runs, in.args)
		case "EXPOSE":
			exposes = append(exposes, in.args)
		case "HEALTHCHECK":
			healthchecks = append(healthchecks, in.args)
		case "ENTRYPOINT":
			entrypoints = append(entrypoints, in.args)
		case "CMD":
			cmds = append(cmds, in.args)
		}
	}
	if len(froms) != 2 {
		t.Fatalf("FROM %q: want two stages (builder, distroless)", froms)
	}
	if want := "golang:" + goVersion(t) + " "; !strings.Contains(froms[0]+" ", want) {
		t.Errorf("builder FROM %q, want %s (go.mod's go directive)", froms[0], strings.TrimSpace(want))
	}
	if froms[1] != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("final FROM %q, want gcr.io/distroless/static-debian12:nonroot", froms[1])
	}
	if !slices.Equal(users, []string{"nonroot:nonroot"}) {
		t.Errorf("USER %q, want nonroot:nonroot", users)
	}

	build := ""
	for _, r := range runs {
		if strings.Contains(r, "go build") {
			build = r
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X main.buildVersion=${VERSION}", "-o /out/rls ./cmd/rls"} {
		if !strings.Contains(build, want) {
			t.Errorf("go build step %q lacks %q", build, want)
		}
	}
	// -X on a missing variable is silently ignored: make sure it exists.
	if !regexp.MustCompile(`(?m)^var buildVersion = `).Match(readFile(t, filepath.Join(root, "cmd", "rls", "validate.go"))) {
		t.Error("cmd/rls has no `var buildVersion = ...` for -X main.buildVersion")
	}

	if !slices.Contains(copies, "--from=build /out/rls /rls") {
		t.Errorf("COPY %q: the binary must be copied to /rls", copies)
	}
	if !slices.Contains(copies, "config/limits.yaml /etc/rls/limits.yaml") {
		t.Errorf("COPY %q: config/limits.yaml must be copied to /etc/rls/limits.yaml", copies)
	}
	if len(entrypoints) != 1 || !slices.Equal(execForm(t, entrypoints[0]), []string{"/rls"}) {
		t.Errorf("ENTRYPOINT %q, want [\"/rls\"]", entrypoints)
	}
	if len(cmds) != 1 || !slices.Equal(execForm(t, cmds[0]), []string{"serve", "--config", "/etc/rls/limits.yaml"}) {
		t.Errorf("CMD %q, want [\"serve\", \"--config\", \"/etc/rls/limits.yaml\"]", cmds)
	}
	if !slices.Equal(exposes, []string{"8080 8081"}) {
		t.Errorf("EXPOSE %q, want 8080 8081 (rls's default --http-addr and --grpc-addr)", exposes)
	}
	if len(healthchecks) != 1 {
		t.Fatalf("HEALTHCHECK %q, want one", healthchecks)
	}
	_, hc, _ := strings.Cut(healthchecks[0], " CMD ")
	if !slices.Equal(execForm(t, hc), []string{"/rls", "healthcheck"}) {
		t.Errorf("HEALTHCHECK %q, want CMD [\"/rls\", \"healthcheck\"]", healthchecks[0])
	}
}

// ignoreRule is one .dockerignore line.
type ignoreRule struct {
	re      *regexp.Regexp
	include bool // a "!" line
}

// parseDockerignore reads .dockerignore with Docker's rules: patterns in
// path.Match syntax plus "**" for any number of directories, matched
// against a path and each of its parent directories; a later line wins; "!"
// re-includes.
func parseDockerignore(t *testing.T, data []byte) []ignoreRule {
	t.Helper()
	var rules []ignoreRule
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRule{}
		if rest, ok := strings.CutPrefix(line, "!"); ok {
			r.include, line = true, rest
		}
		line = strings.TrimPrefix(path.Clean(line), "/")
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(line); i++ {
			switch c := line[i]; {
			case strings.HasPrefix(line[i:], "**/"):
				re.WriteString("(?:.*/)?")
				i += 2
			case strings.HasPrefix(line[i:], "**"):
				re.WriteString(".*")
				i++
			case c == '*':
				re.WriteString("[^/]*")
			case c == '?':
				re.WriteString("[^/]")
			case c == '[' || c == '\\':
				t.Fatalf(".dockerignore: %q: character classes and escapes are not modelled by this test", line)
			default:
				re.WriteString(regexp.QuoteMeta(string(c)))
			}
		}
		re.WriteString("$")
		r.re = regexp.MustCompile(re.String())
		rules = append(rules, r)
	}
	return rules
}

// ignored reports whether Docker leaves file (slash-separated, relative to
// the context) out of the build context.
func ignored(rules []ignoreRule, file string) bool {
	out := false
	for _, r := range rules {
		for p := file; p != "."; p = path.Dir(p) {
			if r.re.MatchString(p) {
				out = !r.include
				break
			}
		}
	}
	return out
}

// TestDockerignore checks that every file `go build ./cmd/rls` reads (as
// `go list` reports them, embedded files included) and every COPY source
// gets into the build context, and that what must not (the repository's
// history, binaries, tests) stays out.
func TestDockerignore(t *testing.T) {
	rules := parseDockerignore(t, readFile(t, filepath.Join(root, ".dockerignore")))
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command to list the build's files: %v", err)
	}
	list := exec.CommandContext(t.Context(), gobin, "list", "-deps",
		"-f", `{{if and .Module .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}`,
		"./cmd/rls")
	list.Dir = root
	outb, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	need := []string{"go.mod", "go.sum", "config/limits.yaml"}
	for _, f := range strings.Fields(string(outb)) {
		rel, err := filepath.Rel(abs, f)
		if err != nil {
			t.Fatal(err)
		}
		need = append(need, filepath.ToSlash(rel))
	}
	if len(need) < 10 {
		t.Fatalf("go list found only %v", need)
	}
	for _, f := range need {
		if ignored(rules, f) {
			t.Errorf(".dockerignore leaves %s out of the build context; the image build needs it", f)
		}
	}
	for _, f := range []string{".git/config", "bin/rls", "e2e/e2e_test.go", "envoy/envoy.yaml", "docker-compose.yaml", "internal/config/parse_test.go", "internal/config/testdata/bad/x.yaml", "README.md"} {
		if !ignored(rules, f) {
			t.Errorf(".dockerignore lets %s into the build context", f)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "config", "limits.yaml")); err != nil {
		t.Error(err)
	}
}
