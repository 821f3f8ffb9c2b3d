package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/proctest"
)

// A runnable block is a fenced block right after a marker line:
//
//	<!-- docs-check: GROUP ROLE [align-second] [ready=URL] -->
//
// Blocks of one group (in one file) run in document order in one bash
// process, in the repository's root, inside a network and process namespace
// of their own (unshare): loopback ports as written (8080, 6379, 8888...) are
// free there whatever runs on the machine, and every process a block starts
// ends with the group. The roles:
//
//	run      run it; its output is only shown when something fails
//	expect   run it; its stdout must equal the block's trailing comment
//	         lines, "# " removed (trailing spaces ignored)
//	serve    a foreground server (`make run`): started in the background in
//	         its own process group, then ready (default
//	         http://127.0.0.1:8080/readyz) must answer 200; stopped with
//	         SIGTERM after the group's run and expect blocks
//	cleanup  run after the servers are stopped, even when a block failed
//
// align-second starts the block at the top of a wall-clock second: fixed
// windows are epoch-aligned, so eleven requests meant to fall in one second
// must not straddle two. After the cleanup blocks nothing the blocks started
// may still run, and the repository must hold no new files.
type block struct {
	file   string // relative to the repository root
	line   int    // of the fence
	group  string
	role   string
	align  bool
	ready  string
	body   string
	expect string // role expect: the wanted stdout
}

func (b block) String() string { return fmt.Sprintf("%s:%d (%s %s)", b.file, b.line, b.group, b.role) }

var markerRE = regexp.MustCompile(`^<!-- docs-check: (.*) -->$`)

// parseBlocks finds the marked blocks of one Markdown file.
func parseBlocks(file string, src []byte) ([]block, error) {
	lines := strings.Split(string(src), "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		m := markerRE.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			if strings.Contains(lines[i], "docs-check:") && strings.HasPrefix(strings.TrimSpace(lines[i]), "<!--") {
				return nil, fmt.Errorf("%s:%d: malformed marker %q", file, i+1, lines[i])
			}
			continue
		}
		fields := strings.Fields(m[1])
		if len(fields) < 2 {
			return nil, fmt.Errorf("%s:%d: marker needs a group and a role: %q", file, i+1, lines[i])
		}
		b := block{file: file, group: fields[0], role: fields[1], ready: "http://127.0.0.1:8080/readyz"}
		switch b.role {
		case "run", "expect", "serve", "cleanup":
		default:
			return nil, fmt.Errorf("%s:%d: role %q is not one of run|expect|serve|cleanup", file, i+1, b.role)
		}
		for _, f := range fields[2:] {
			switch {
			case f == "align-second":
				b.align = true
			case strings.HasPrefix(f, "ready="):
				b.ready = strings.TrimPrefix(f, "ready=")
			default:
				return nil, fmt.Errorf("%s:%d: unknown marker option %q", file, i+1, f)
			}
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, fmt.Errorf("%s:%d: marker not followed by a fenced block", file, i+1)
		}
		b.line = i + 2
		var body []string
		j := i + 2
		for ; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			body = append(body, lines[j])
		}
		if j == len(lines) {
			return nil, fmt.Errorf("%s:%d: fenced block not closed", file, b.line)
		}
		b.body = strings.Join(body, "\n") + "\n"
		if b.role == "expect" {
			k := len(body)
			for k > 0 && (strings.HasPrefix(body[k-1], "# ") || body[k-1] == "#") {
				k--
			}
			if k == len(body) || k == 0 {
				return nil, fmt.Errorf("%s:%d: an expect block ends with its output as comment lines (# ...) after a command", file, b.line)
			}
			var want []string
			for _, l := range body[k:] {
				want = append(want, strings.TrimPrefix(strings.TrimPrefix(l, "#"), " "))
			}
			b.expect = strings.Join(want, "\n")
		}
		out = append(out, b)
		i = j
	}
	return out, nil
}

// groups collects the marked blocks of files, group by group, in the order
// the groups first appear.
func groups(t *testing.T, files ...string) [][]block {
	t.Helper()
	var order []string
	byGroup := map[string][]block{}
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := parseBlocks(f, src)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			key := f + ": " + b.group
			if _, ok := byGroup[key]; !ok {
				order = append(order, key)
			}
			byGroup[key] = append(byGroup[key], b)
		}
	}
	out := make([][]block, 0, len(order))
	for _, k := range order {
		out = append(out, byGroup[k])
	}
	return out
}

// script is the bash program that runs one group; results go to files in
// dir (N.out, N.err, N.rc per block; leftovers). Processes still running
// after the cleanup blocks get settle to exit (a stopped server takes a
// moment) before they count as left running.
func script(bs []block, dir string, settle time.Duration) string {
	var s strings.Builder
	fmt.Fprintf(&s, "R=%q\ncd %q\n", dir, repoRoot)
	s.WriteString(`ip link set lo up || exit 97
serves=()
leftovers() {
	# builtins only, so that the check itself starts no process
	local p st argv
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		[ "$p" = 1 ] || [ "$p" = "$BASHPID" ] && continue
		read -r st < "/proc/$p/stat" 2>/dev/null || continue
		st=${st##*) }; [ "${st%% *}" = Z ] && continue
		mapfile -d '' argv < "/proc/$p/cmdline" 2>/dev/null
		printf '%s: %s\n' "$p" "${argv[*]}"
	done
}
align_second() {
	local ns; ns=$(date +%N)
	sleep "0.$(printf '%09d' $((1000000000 - 10#$ns)))"
}
finish() {
	echo $? > "$R/main.rc"
	set +e
	for p in "${serves[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
	for p in "${serves[@]}"; do wait "$p"; done
`)
	for i, b := range bs {
		if b.role == "cleanup" {
			fmt.Fprintf(&s, "\t{ set -e; . \"$R/%d.sh\"; } </dev/null >\"$R/%d.out\" 2>\"$R/%d.err\"; echo $? > \"$R/%d.rc\"\n", i, i, i, i)
		}
	}
	fmt.Fprintf(&s, "\tfor i in $(seq %d); do left=$(leftovers); [ -z \"$left\" ] && break; sleep 0.1; done\n", max(1, int(settle/(100*time.Millisecond))))
	s.WriteString(`
	printf '%s' "$left" > "$R/leftovers"
}
trap finish EXIT
set -e
`)
	for i, b := range bs {
		switch b.role {
		case "run", "expect":
			if b.align {
				s.WriteString("align_second\n")
			}
			fmt.Fprintf(&s, "{ . \"$R/%d.sh\"; } </dev/null >\"$R/%d.out\" 2>\"$R/%d.err\"\necho 0 > \"$R/%d.rc\"\n", i, i, i, i)
		case "serve":
			fmt.Fprintf(&s, "setsid bash \"$R/%d.sh\" </dev/null >\"$R/%d.out\" 2>\"$R/%d.err\" &\npid=$!; serves+=(\"$pid\")\n", i, i, i)
			fmt.Fprintf(&s, "for i in $(seq 600); do\n\tcurl -sf -o /dev/null %q && break\n\tkill -0 \"$pid\" 2>/dev/null || { echo 'exited before it was ready' >> \"$R/%d.err\"; exit 98; }\n\tsleep 0.1\ndone\n", b.ready, i)
			fmt.Fprintf(&s, "curl -sf -o /dev/null %q || { echo 'not ready after 60 s' >> \"$R/%d.err\"; exit 99; }\necho 0 > \"$R/%d.rc\"\n", b.ready, i, i)
		}
	}
	return s.String()
}

// runGroup runs one group's blocks and returns every difference from what
// the blocks promise, and their outputs.
func runGroup(t *testing.T, bs []block, settle time.Duration) (problems []string, outputs string) {
	t.Helper()
	dir := t.TempDir()
	for i, b := range bs {
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)+".sh"), []byte(b.body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := repoFiles(t)
	args := []string{"--net", "--pid", "--fork", "--mount-proc", "--kill-child"}
	if os.Geteuid() != 0 {
		args = append([]string{"--map-root-user"}, args...)
	}
	args = append(args, "bash", "-c", script(bs, dir, settle))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", args...)
	// RLS_STORE_TIMEOUT: the blocks' outputs are exact, and on a machine
	// busy with other tests' processes a Redis round trip can miss the
	// 10 ms default (a block written with --store-timeout still sets its own).
	cmd.Env = append(os.Environ(), "PATH="+redisPath(t)+os.Getenv("PATH")+":/usr/sbin:/sbin", "RLS_STORE_TIMEOUT=1s")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	err := cmd.Run()
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return string(b)
	}
	show := func(i int) string {
		return fmt.Sprintf("--- stdout\n%s--- stderr\n%s", read(fmt.Sprintf("%d.out", i)), read(fmt.Sprintf("%d.err", i)))
	}
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if err != nil {
		bad("unshare ... bash: %v\n%s", err, stderr.String())
	}
	switch rc := strings.TrimSpace(read("main.rc")); rc {
	case "97":
		bad("could not bring up loopback in the group's network namespace (iproute2's ip)")
	case "":
		bad("the group's script did not finish\n%s", stderr.String())
	}
	for i, b := range bs {
		rc := strings.TrimSpace(read(fmt.Sprintf("%d.rc", i)))
		switch {
		case rc == "" && b.role != "cleanup":
			bad("%s: failed or not reached (the group's script stopped with exit status %s)\n%s", b, strings.TrimSpace(read("main.rc")), show(i))
		case rc != "0" && rc != "":
			bad("%s: exit status %s\n%s", b, rc, show(i))
		case b.role == "expect":
			got := trimLines(read(fmt.Sprintf("%d.out", i)))
			if got != trimLines(b.expect) {
				bad("%s: output\n%s\nwant (the block's trailing comment)\n%s", b, got, b.expect)
			}
		}
		if rc == "" && b.role != "cleanup" {
			break // the blocks after it did not run
		}
	}
	if left := read("leftovers"); left != "" {
		bad("%s: processes still running after the group's cleanup blocks:\n%s", bs[0].group, left)
	}
	if added := newFiles(before, repoFiles(t)); len(added) > 0 {
		bad("%s: the blocks left files in the repository: %s", bs[0].group, strings.Join(added, ", "))
	}
	var out strings.Builder
	for i, b := range bs {
		fmt.Fprintf(&out, "%s:\n%s", b, show(i))
	}
	return problems, out.String()
}

func trimLines(s string) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		out = append(out, strings.TrimRight(sc.Text(), " \t\r"))
	}
	return strings.TrimRight(strings.Join(out, "\n"), "\n")
}

// repoFiles lists the files and directories git sees at the top of the
// repository, untracked and ignored ones included, bin/ aside. The blocks
// run in the root, where what they leave lands; other packages' tests, which
// may run meanwhile, work in their own directories.
func repoFiles(t *testing.T) map[string]bool {
	t.Helper()
	// untracked-files=normal shows a new directory as one "dir/" entry.
	cmd := exec.Command("git", "status", "--porcelain", "--ignored", "--untracked-files=normal")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git status: %v", err)
	}
	files := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if len(l) <= 3 {
			continue
		}
		path := strings.Trim(l[3:], `"`)
		if strings.Contains(strings.TrimSuffix(path, "/"), "/") || path == "bin/" {
			continue // inside a directory of the repository, or the binary
		}
		files[path] = true
	}
	return files
}

func newFiles(before, after map[string]bool) []string {
	var out []string
	for f := range after {
		if !before[f] {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// redisPath returns a directory to put first in the blocks' PATH, with a
// colon, where redis-server and redis-cli are the server and client that
// RLS_TEST_REDIS_SERVER and RLS_TEST_REDIS_CLI name (`make test-store`),
// so that the blocks, written for redis-server, run on them; "" when they
// are not set.
func redisPath(t *testing.T) string {
	t.Helper()
	if !proctest.RedisNamed() {
		return ""
	}
	dir := t.TempDir()
	server, err := proctest.RedisServer()
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]string{"redis-server": server}
	if os.Getenv(proctest.EnvRedisCLI) != "" {
		cli, err := proctest.RedisCLI()
		if err != nil {
			t.Fatal(err)
		}
		links["redis-cli"] = cli
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir + ":"
}

// runnableFiles are the Markdown files whose marked blocks are run.
var runnableFiles = []string{"README.md", "docs/nginx.md"}

// TestRunnableBlocks runs every marked block of the README and docs/, group
// by group, as written.
func TestRunnableBlocks(t *testing.T) {
	need(t, "unshare", "ip", "curl", "bash", "redis-server", "redis-cli", "nginx")
	gs := groups(t, runnableFiles...)
	if len(gs) == 0 {
		t.Fatal("no marked blocks found")
	}
	for _, bs := range gs {
		t.Run(bs[0].file+"/"+bs[0].group, func(t *testing.T) {
			problems, outputs := runGroup(t, bs, 10*time.Second)
			for _, p := range problems {
				t.Error(p)
			}
			if len(problems) > 0 {
				t.Logf("the group's blocks:\n%s", outputs)
			}
		})
	}
}

// TestCheckerCatches: the block runner reports a wrong output, a failing
// block (and still runs the cleanup), a process left running and a file
// left in the repository, and accepts a group that keeps its promises.
func TestCheckerCatches(t *testing.T) {
	need(t, "unshare", "ip", "bash")
	const probe = ".docs-check-probe" // a file a bad block leaves in the repository
	t.Cleanup(func() { os.Remove(filepath.Join(repoRoot, probe)) })
	mark := t.TempDir()
	t.Setenv("DOCS_CHECK_MARK", mark)
	md := func(blocks ...string) []block {
		src := strings.Join(blocks, "\n")
		bs, err := parseBlocks("test.md", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return bs
	}
	for _, tc := range []struct {
		name      string
		bs        []block
		want      []string // substrings of the problems, in order; none = no problem
		cleanedUp bool
	}{
		{"good", md("<!-- docs-check: g run -->\n```sh\nx=hello\n```", "<!-- docs-check: g expect -->\n```sh\necho $x; echo world\n# hello\n# world\n```",
			"<!-- docs-check: g cleanup -->\n```sh\ntouch \"$DOCS_CHECK_MARK/good\"\n```"), nil, true},
		{"wrong output", md("<!-- docs-check: g expect -->\n```sh\necho 200 429\n# 200 200\n```"), []string{"output\n200 429\nwant"}, false},
		{"failing block", md("<!-- docs-check: g run -->\n```sh\nfalse\necho not reached\n```", "<!-- docs-check: g expect -->\n```sh\necho x\n# x\n```",
			"<!-- docs-check: g cleanup -->\n```sh\ntouch \"$DOCS_CHECK_MARK/failing block\"\n```"), []string{"test.md:2 (g run): failed or not reached"}, true},
		{"left running", md("<!-- docs-check: g run -->\n```sh\nsleep 300 &\n```"), []string{"processes still running", "sleep 300"}, false},
		{"left a file", md("<!-- docs-check: g run -->\n```sh\ntouch " + probe + "\n```"), []string{"left files in the repository: " + probe}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problems, outputs := runGroup(t, tc.bs, time.Second)
			all := strings.Join(problems, "\n")
			if len(tc.want) == 0 && len(problems) > 0 {
				t.Errorf("problems:\n%s\n%s", all, outputs)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("problems do not mention %q:\n%s", w, all)
				}
			}
			if _, err := os.Stat(filepath.Join(mark, tc.name)); (err == nil) != tc.cleanedUp {
				t.Errorf("cleanup block ran = %v, want %v", err == nil, tc.cleanedUp)
			}
		})
	}
}

// TestExpectedBlocks: the groups that the README promises, so that a
// marker lost in an edit does not silently drop a check.
func TestExpectedBlocks(t *testing.T) {
	have := map[string]bool{}
	for _, bs := range groups(t, runnableFiles...) {
		have[bs[0].file+": "+bs[0].group] = true
	}
	for _, want := range []string{"README.md: quickstart", "README.md: redis", "README.md: cluster", "README.md: nginx", "README.md: reset", "README.md: concurrency", "README.md: overrides", "README.md: overrides-test", "README.md: llm", "README.md: llm-nginx", "docs/nginx.md: try-it"} {
		if !have[want] {
			t.Errorf("no runnable group %q", want)
		}
	}
}

// need fails the test when a program the blocks use is missing (nginx may
// be in /usr/sbin, off a non-root PATH).
func need(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/usr/sbin", p)); err == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sbin", p)); err == nil {
			continue
		}
		t.Fatalf("%s not found: the README's blocks need it (make prereqs installs what they need on Debian)", p)
	}
}
