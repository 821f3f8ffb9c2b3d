package docs_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRedisRecipesPortTaken runs the README's Redis recipes with their
// first port already held: by another Redis (a developer's own), and for
// the cluster by a server that is no Redis (rls's HTTP port), where the
// recipe used to wait for a PONG for ever. The recipe's first block must
// fail at once, saying that the server it started exited and why, rather
// than wait for ever or go on with the other server; the later blocks do
// not run, the cleanup stops what the recipe started and nothing else (the
// other server still answers, the same process), and nothing is left
// running.
func TestRedisRecipesPortTaken(t *testing.T) {
	need(t, "unshare", "ip", "curl", "bash", "redis-server", "redis-cli")
	byGroup := map[string][]block{}
	for _, bs := range groups(t, "README.md") {
		byGroup[bs[0].group] = bs
	}
	// The other server's start and check, by kind, for the port %[1]d.
	holders := map[string][2]string{
		"redis": {`other=$(mktemp -d)
redis-server --port %[1]d --bind 127.0.0.1 --save '' --appendonly no --dir "$other" \
  --daemonize yes --pidfile "$other/redis-%[1]d.pid" --logfile "$other/redis-%[1]d.log"
scripts/redis-wait.sh "$other" %[1]d
other_pid=$(cat "$other/redis-%[1]d.pid")
`, `answering=$(redis-cli -p %[1]d info server | tr -d '\r' | sed -n 's/^process_id://p')
[ "$answering" = "$other_pid" ] || { echo "the other Redis (pid $other_pid) no longer answers on %[1]d (now: ${answering:-nothing})" >&2; false; }
scripts/redis-stop.sh "$other"
rm -rf "$other"
`},
		"http": {`./bin/rls serve --http-addr 127.0.0.1:%[1]d --grpc-addr 127.0.0.1:0 >/dev/null 2>&1 &
other_pid=$!
for i in $(seq 100); do curl -sf -o /dev/null localhost:%[1]d/readyz && break; sleep 0.1; done
curl -sf -o /dev/null localhost:%[1]d/readyz
`, `kill -0 "$other_pid" && curl -sf -o /dev/null localhost:%[1]d/readyz || { echo "the other server (pid $other_pid) no longer answers on %[1]d" >&2; false; }
kill "$other_pid"
wait "$other_pid" || true
`},
	}
	for _, tc := range []struct {
		group  string
		port   int // the first port the recipe starts a server on
		holder string
	}{
		{"redis", 6379, "redis"},
		{"cluster", 7000, "redis"},
		{"cluster", 7000, "http"},
		{"sentinel", 6379, "redis"},
		{"per-second", 6379, "redis"},
	} {
		t.Run(tc.group+"/"+tc.holder, func(t *testing.T) {
			recipe := byGroup[tc.group]
			if len(recipe) == 0 || recipe[0].role != "run" {
				t.Fatalf("README.md has no group %q that starts with a run block", tc.group)
			}
			h := holders[tc.holder]
			start := block{file: "(the other server)", group: tc.group, role: "run", body: fmt.Sprintf(h[0], tc.port)}
			check := block{file: "(the other server)", group: tc.group, role: "cleanup", body: fmt.Sprintf(h[1], tc.port)}
			bs := append(append([]block{start}, recipe...), check)
			all, outputs := runGroup(t, bs, 10*time.Second)
			var problems []string // the group's script ends with the failure's status: that is expected
			for _, p := range all {
				if !strings.HasPrefix(p, "unshare ... bash: exit status ") {
					problems = append(problems, p)
				}
			}
			wantFailed := recipe[0].String() + ": failed or not reached"
			wantWhy := fmt.Sprintf("redis-wait: port %d: the redis-server started (pid ", tc.port)
			if len(problems) != 1 || !strings.Contains(problems[0], wantFailed) || !strings.Contains(problems[0], wantWhy) || !strings.Contains(problems[0], "Address already in use") {
				t.Errorf("problems:\n%s\nwant one: %q, its stderr saying %q and why (Address already in use)\n%s",
					strings.Join(problems, "\n"), wantFailed, wantWhy, outputs)
			}
		})
	}
}
