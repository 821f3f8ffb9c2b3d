package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/redistest"
	"github.com/rlsproject/rls/internal/servetest"
)

// The flags of Redis Sentinel and of the per-second Redis, from the command
// line and the environment.
func TestRedisTopologyFlags(t *testing.T) {
	o, err := parseServeFlags([]string{"--store", "redis", "--redis-url", "rediss://:pw@ignored/2", "--redis-ca", "/ca.pem",
		"--redis-sentinel", "mymaster, s1:26379 ,s2:26379", "--redis-sentinel-user", "watcher", "--redis-tls-skip-hostname",
		"--redis-per-second-sentinel", "fast,s3:26379"},
		[]string{"RLS_REDIS_SENTINEL_PASSWORD=s3cret", "RLS_REDIS_PER_SECOND_SENTINEL_PASSWORD=other", "RLS_REDIS_POOL_SIZE=3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sen, ps := o.Store.Redis.Sentinel, o.Store.Redis.PerSecond
	if sen == nil || ps == nil || ps.Sentinel == nil {
		t.Fatalf("sentinel %+v, per-second %+v", sen, ps)
	}
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"master", sen.Master, "mymaster"},
		{"sentinels", strings.Join(sen.Addrs, ","), "s1:26379,s2:26379"},
		{"sentinels' credentials", sen.Username + ":" + sen.Password, "watcher:s3cret"},
		{"host name check", o.Store.Redis.TLSSkipHostname, true},
		{"per-second master", ps.Sentinel.Master, "fast"},
		{"per-second sentinels", strings.Join(ps.Sentinel.Addrs, ","), "s3:26379"},
		{"per-second sentinels' credentials", ps.Sentinel.Username + ":" + ps.Sentinel.Password, ":other"},
		{"per-second URL (--redis-url's)", ps.URL, "rediss://:pw@ignored/2"},
		{"per-second CA, pool, host name check", ps.CAFile + " " + strings.Repeat("x", ps.PoolSize) + " " + map[bool]string{true: "skip"}[ps.TLSSkipHostname], "/ca.pem xxx skip"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	o, err = parseServeFlags([]string{"--redis-per-second-url", "redis://fast:6379/0"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if ps := o.Store.Redis.PerSecond; ps == nil || ps.URL != "redis://fast:6379/0" || ps.ClusterSeeds != nil || ps.Sentinel != nil || o.Store.Redis.Sentinel != nil {
		t.Errorf("--redis-per-second-url alone: per-second %+v, sentinel %+v", ps, o.Store.Redis.Sentinel)
	}
	if o, err = parseServeFlags(nil, nil, io.Discard); err != nil || o.Store.Redis.Sentinel != nil || o.Store.Redis.PerSecond != nil {
		t.Errorf("no flags: %v, sentinel %+v, per-second %+v; want neither", err, o.Store.Redis.Sentinel, o.Store.Redis.PerSecond)
	}

	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--redis-sentinel", "mymaster"}, nil, `--redis-sentinel: "mymaster" is not master,host:port`},
		{[]string{"--redis-sentinel", "mymaster,s1"}, nil, `--redis-sentinel: "mymaster,s1": sentinel "s1" is not host:port`},
		{nil, []string{"RLS_REDIS_SENTINEL=m,s1:"}, `RLS_REDIS_SENTINEL (--redis-sentinel): "m,s1:": sentinel "s1:" is not host:port`},
		{[]string{"--redis-sentinel-password", "x"}, nil, "--redis-sentinel-user and --redis-sentinel-password need --redis-sentinel"},
		{[]string{"--redis-cluster", "a:1", "--redis-sentinel", "m,s:1"}, nil, "--redis-sentinel: --redis-cluster is set too"},
		{[]string{"--redis-per-second-cluster", "a:1", "--redis-per-second-sentinel", "m,s:1"}, nil, "--redis-per-second-sentinel: --redis-per-second-cluster is set too"},
		{[]string{"--redis-per-second-sentinel-user", "u"}, nil, "need --redis-per-second-sentinel"},
	} {
		_, err := parseServeFlags(tc.args, tc.env, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || exitCode(err) != 2 {
			t.Errorf("%q %q: %v (exit %d), want a usage error containing %q", tc.args, tc.env, err, exitCode(err), tc.want)
		}
	}
}

// TestSentinelFailoverServed: rls on a master that Sentinel watches
// (--redis-sentinel), the master killed: while there is none, requests get
// UNAVAILABLE (--on-store-error=error) within the bound and /readyz says
// 503; once a replica is promoted, requests succeed again and /readyz says
// 200, with the same rls process, and the hits counted before the failover
// still count.
func TestSentinelFailoverServed(t *testing.T) {
	st := redistest.StartSentinel(t, redistest.SentinelConfig{DownAfter: 2 * time.Second})
	cfg := writeFile(t, t.TempDir(), "failover.yaml", "domain: failover\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	s := startServer(t, nil, "--config", cfg, "--store", "redis", "--redis-sentinel", st.Spec(), "--store-timeout", "200ms")
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	ready := func() int {
		resp, err := http.Get("http://" + s.httpAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 10 {
		s.waitUntil(t, "a request before the failover decided", func() bool {
			resp, err := askBounded(rl, rlRequest("failover", "k", "v"))
			return err == nil && resp.GetStatuses()[0].GetLimitRemaining() == uint32(99-i)
		})
	}
	old := st.Master()
	if n, err := old.Do("WAIT", "1", "5000"); err != nil || n != "1" {
		t.Fatalf("WAIT for the replica: %q, %v", n, err)
	}

	old.Kill()
	for i := range 3 { // within the 2 s before the sentinels take the master for down
		if _, err := askBounded(rl, rlRequest("failover", "k", "v")); status.Code(err) != codes.Unavailable {
			t.Errorf("request %d with the master dead: %v, want UNAVAILABLE", i, err)
		}
	}
	if got := ready(); got != 503 {
		t.Errorf("/readyz with the master dead = %d, want 503", got)
	}
	promoted := st.WaitFailover(old)
	var remaining uint32
	s.waitUntil(t, "a request decided on the promoted master "+promoted.Addr(), func() bool {
		resp, err := askBounded(rl, rlRequest("failover", "k", "v"))
		if err != nil {
			return false
		}
		remaining = resp.GetStatuses()[0].GetLimitRemaining()
		return true
	})
	if remaining != 89 {
		t.Errorf("first request after the failover: %d remaining, want 89 (the 10 hits before it replicated)", remaining)
	}
	s.waitUntil(t, "/readyz 200 after the failover", func() bool { return ready() == 200 })
	if !strings.Contains(s.logs.String(), "Sentinel names another master") {
		t.Errorf("the log does not say the master changed:\n%s", s.logs)
	}
}

// The sentinels' password never reaches the log.
func TestSentinelPasswordNotLogged(t *testing.T) {
	cfg := writeFile(t, t.TempDir(), "p.yaml", "domain: p\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	s := startServer(t, []string{"RLS_REDIS_SENTINEL_PASSWORD=hunter2"}, "--config", cfg, "--store", "redis",
		"--redis-sentinel", "m,"+servetest.Addr(t), "--redis-url", "redis://:swordfish@ignored/0", "--log-level", "debug")
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	if _, err := rl.ShouldRateLimit(context.Background(), rlRequest("p", "k", "v")); status.Code(err) != codes.Unavailable {
		t.Errorf("with no sentinel answering: %v, want UNAVAILABLE", err)
	}
	s.stop(t)
	if logs := s.logs.String(); strings.Contains(logs, "hunter2") || strings.Contains(logs, "swordfish") {
		t.Errorf("a password appears in the log:\n%s", logs)
	}
}
