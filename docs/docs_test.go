// Package docs_test checks the documentation against the code it describes:
// every relative link and anchor of the repository's Markdown files
// resolves, the README's and docs/'s runnable blocks run as written against
// a freshly built bin/rls (blocks_test.go), and `make install` installs it.
// `make docs-check` runs this package alone; `make test` runs it with the
// rest.
package docs_test

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/rlsproject/rls/internal/proctest"
)

// repoRoot is the repository's root (this package is docs/).
var repoRoot string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repoRoot = filepath.Dir(wd)
	// The blocks call ./bin/rls and `make run`, as a reader does: build it
	// the way the README says (make build; `make run` rebuilds bin/rls
	// anyway). proctest.RLS compiles with make build's flags: asked first,
	// it waits for the build that the other packages of the run share (or
	// makes it), and make build then only links, where both would compile
	// everything side by side on a cold cache.
	if _, err := proctest.RLS(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	build := exec.Command("make", "--no-print-directory", "build")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "make build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// markdownFiles lists the repository's Markdown files, relative to its root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != repoRoot && (strings.HasPrefix(name, ".") || name == "bin" || name == "node_modules" || name == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".md") {
			rel, _ := filepath.Rel(repoRoot, path)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 3 {
		t.Fatalf("found only %v", out)
	}
	return out
}

// link is one [text](target) of a Markdown file.
type link struct {
	line   int
	target string
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	refDefRE  = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	headingRE = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	codeRE    = regexp.MustCompile("`[^`]*`")
	htmlIDRE  = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// scan returns the links of a Markdown file and the anchors its headings
// make, outside fenced code blocks and code spans.
func scan(src string) (links []link, anchors map[string]bool) {
	anchors = map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for i, l := range strings.Split(src, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range htmlIDRE.FindAllStringSubmatch(l, -1) {
			anchors[m[1]] = true
		}
		if m := headingRE.FindStringSubmatch(l); m != nil {
			a := slug(m[2])
			if n := seen[a]; n > 0 {
				anchors[fmt.Sprintf("%s-%d", a, n)] = true
			} else {
				anchors[a] = true
			}
			seen[a]++
		}
		if m := refDefRE.FindStringSubmatch(l); m != nil {
			links = append(links, link{i + 1, m[1]})
			continue
		}
		plain := codeRE.ReplaceAllString(l, "")
		for _, m := range linkRE.FindAllStringSubmatch(plain, -1) {
			links = append(links, link{i + 1, m[1]})
		}
	}
	return links, anchors
}

// slug is GitHub's anchor for a heading: the text without Markdown
// formatting, lower case, punctuation other than - and _ dropped, spaces
// turned into -.
func slug(heading string) string {
	h := regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Running with Redis and Redis Cluster", "running-with-redis-and-redis-cluster"},
		{"Envoy ext_authz", "envoy-ext_authz"},
		{"Differences from envoyproxy/ratelimit", "differences-from-envoyproxyratelimit"},
		{"`location = /_ratelimit`", "location--_ratelimit"},
		{"Try it: nginx in front of [rls](README.md)", "try-it-nginx-in-front-of-rls"},
	} {
		if got := slug(tc.in); got != tc.want {
			t.Errorf("slug(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestLinks: every relative link of every Markdown file names a file or
// directory that exists, and every #anchor a heading of its file.
func TestLinks(t *testing.T) {
	files := markdownFiles(t)
	anchorsOf := map[string]map[string]bool{}
	linksOf := map[string][]link{}
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		linksOf[f], anchorsOf[f] = scan(string(src))
	}
	checked := 0
	for _, f := range files {
		for _, l := range linksOf[f] {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(l.target, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
				if strings.HasPrefix(path, "/") {
					t.Errorf("%s:%d: %s: an absolute path; links are relative to the file", f, l.line, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(repoRoot, target)); err != nil {
					t.Errorf("%s:%d: %s: no such file %s", f, l.line, l.target, target)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			anchors, ok := anchorsOf[filepath.Clean(target)]
			if !ok {
				t.Errorf("%s:%d: %s: an anchor into %s, which is not a Markdown file", f, l.line, l.target, target)
				continue
			}
			if !anchors[anchor] {
				t.Errorf("%s:%d: %s: %s has no heading with that anchor", f, l.line, l.target, target)
			}
		}
	}
	if checked < 10 {
		t.Errorf("checked only %d relative links: is the link pattern still right?", checked)
	}
}

// TestLinkCheckerCatches: the checker reports what it is for.
func TestLinkCheckerCatches(t *testing.T) {
	links, anchors := scan("# Top\n## A `b` c\n[x](nginx/nginx.conf) `[y](z)`\n```\n[in](fence)\n# not a heading\n```\n[r]: ../y.md#top\n## A b c\n")
	if len(links) != 2 || links[0].target != "nginx/nginx.conf" || links[1].target != "../y.md#top" {
		t.Errorf("links = %+v, want nginx/nginx.conf and ../y.md#top only", links)
	}
	for _, a := range []string{"top", "a-b-c", "a-b-c-1"} {
		if !anchors[a] {
			t.Errorf("anchor %q missing from %v", a, anchors)
		}
	}
	if anchors["not-a-heading"] {
		t.Errorf("a # line in a fence made an anchor")
	}
}

// TestMakeInstall: `make install PREFIX=dir` puts a working rls in dir/bin.
func TestMakeInstall(t *testing.T) {
	prefix := t.TempDir()
	cmd := exec.Command("make", "--no-print-directory", "install", "PREFIX="+prefix)
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make install PREFIX=%s: %v\n%s", prefix, err, out)
	}
	bin := filepath.Join(prefix, "bin", "rls")
	v, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(v), "rls ") {
		t.Errorf("%s version = %q, %v; want rls ...", bin, v, err)
	}
	cmd = exec.Command("make", "--no-print-directory", "uninstall", "PREFIX="+prefix)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make uninstall: %v\n%s", err, out)
	}
	if _, err := os.Stat(bin); !os.IsNotExist(err) {
		t.Errorf("make uninstall left %s (%v)", bin, err)
	}
}

// TestBaseImageNamed: the docs name the image the Dockerfile builds on, as
// the Dockerfile writes it, and no other distroless image.
func TestBaseImageNamed(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var base string
	for _, l := range strings.Split(string(src), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
			base = f[1]
			if strings.HasPrefix(base, "--") && len(f) >= 3 {
				base = f[2]
			}
		}
	}
	if !strings.Contains(base, "distroless") {
		t.Fatalf("Dockerfile's final FROM is %q; update this test and the docs", base)
	}
	other := regexp.MustCompile(`(?:gcr\.io/)?distroless/[a-z0-9-]+(?::[a-z0-9-]+)?`)
	for _, f := range []string{"README.md", "docs/docker.md"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), base) {
			t.Errorf("%s does not name the Dockerfile's base image %s", f, base)
		}
		for _, m := range other.FindAllString(string(b), -1) {
			if m != base {
				t.Errorf("%s names %s; the Dockerfile builds on %s", f, m, base)
			}
		}
	}
}
