package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/servetest"
)

// server is rls started in process by runServer.
type server struct {
	grpcAddr, httpAddr string
	logs               *servetest.SyncBuffer
	cancel             context.CancelFunc
	done               chan error
}

// startServer runs `rls serve` with args plus loopback listeners, waits until
// it answers /healthz, and stops it when the test ends.
func startServer(t *testing.T, env []string, args ...string) *server {
	t.Helper()
	s := launch(t, env, args...)
	s.waitUntil(t, "rls answers /healthz", proctest.HTTPOK("http://"+s.httpAddr+"/healthz"))
	return s
}

// launch runs `rls serve` with args plus loopback listeners, without
// waiting for it, and stops it when the test ends.
func launch(t *testing.T, env []string, args ...string) *server {
	t.Helper()
	grpcAddr, httpAddr := servetest.Addr(t), servetest.Addr(t)
	cfg, err := parseServeFlags(append([]string{"--grpc-addr", grpcAddr, "--http-addr", httpAddr}, args...), env, io.Discard)
	if err != nil {
		t.Fatalf("rls serve %q: %v", args, err)
	}
	// The memory store's clock stopped at storetest.T0: every request of a
	// test at the same instant, so that a per-second limit never straddles
	// a second.
	cfg.Store.Memory.Now = storetest.NewClock(storetest.T0).Now
	return serveConfig(t, cfg, env, grpcAddr, httpAddr)
}

// serveConfig runs the server of cfg (listening on grpcAddr and httpAddr)
// as `rls serve` runs it, SIGHUP included, without waiting for it, and
// stops it when the test ends.
func serveConfig(t *testing.T, cfg daemon.Config, env []string, grpcAddr, httpAddr string) *server {
	t.Helper()
	s := &server{grpcAddr: grpcAddr, httpAddr: httpAddr, logs: &servetest.SyncBuffer{}, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.done <- runServer(ctx, cfg, env, s.logs) }()
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("rls logs:\n%s", s.logs)
		}
	})
	return s
}

// waitUntil waits for cond (see servetest.Eventually), failing at once if
// rls exits meanwhile.
func (s *server) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	servetest.Eventually(t, what, func() bool {
		select {
		case err := <-s.done:
			s.done <- err // for stop
			t.Fatalf("%s: rls exited: %v", what, err)
		default:
		}
		return cond()
	})
}

// stop sends the equivalent of SIGTERM and requires a clean exit.
func (s *server) stop(t *testing.T) {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("rls exited with %v after shutdown, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("rls did not stop within 20s of shutdown")
	}
}

func (s *server) dial(t *testing.T) *grpc.ClientConn { return servetest.Dial(t, s.grpcAddr) }

func rlRequest(domain string, kv ...string) *rlsv3.RateLimitRequest {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonv3.RateLimitDescriptor{d}}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEndToEnd drives the example config over gRPC and HTTP: the multi-window
// limit of config/limits.yaml (10/s + 120/min + 240/h per client address).
func TestEndToEnd(t *testing.T) {
	s := startServer(t, nil, "--config", "../../config/limits.yaml", "--response-headers", "draft03")
	ctx := context.Background()
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))

	// The memory store's clock stands still (launch): the 11 requests
	// share one second window.
	var last *rlsv3.RateLimitResponse
	for i := range 11 {
		resp, err := rl.ShouldRateLimit(ctx, rlRequest("api", "remote_address", "203.0.113.7"))
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 10 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != want {
			t.Fatalf("request %d: %s, want %s (10 per second)", i+1, resp.OverallCode, want)
		}
		last = resp
	}
	st := last.Statuses[0]
	if st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetRequestsPerUnit() != 10 ||
		st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || st.DurationUntilReset.GetSeconds() != 1 {
		t.Errorf("11th status = %v, want OVER_LIMIT by 10/SECOND, reset in 1s", st)
	}
	hdr := map[string]string{}
	for _, h := range last.ResponseHeadersToAdd {
		hdr[h.Key] = h.Value
	}
	if hdr["X-RateLimit-Limit"] != "10, 10;w=1, 120;w=60, 240;w=3600" || hdr["X-RateLimit-Remaining"] != "0" || hdr["Retry-After"] != "1" {
		t.Errorf("response headers = %v", hdr)
	}

	// Malformed requests are InvalidArgument, never a crash.
	for _, bad := range []*rlsv3.RateLimitRequest{
		{Domain: "api"},
		rlRequest("", "k", "v"),
		{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{{}}},
		{Domain: "api", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k"}}, Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}}}},
	} {
		_, err := rl.ShouldRateLimit(ctx, bad)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("ShouldRateLimit(%v) = %v, want InvalidArgument", bad, err)
		}
	}

	// Health and reflection.
	hc, err := healthpb.NewHealthClient(s.dial(t)).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health check = %v, %v; want SERVING", hc, err)
	}
	stream, err := reflectionpb.NewServerReflectionClient(s.dial(t)).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	rr, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, svc := range rr.GetListServicesResponse().GetService() {
		services = append(services, svc.Name)
	}
	if !strings.Contains(strings.Join(services, " "), "envoy.service.ratelimit.v3.RateLimitService") {
		t.Errorf("reflection lists %v, want the RateLimitService", services)
	}

	// HTTP.
	base := "http://" + s.httpAddr
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz = %d, want 200", code)
	}
	code, body := get("/metrics")
	for _, want := range []string{
		`rls_decisions_total{domain="api",limit="remote_address/1s",result="over_limit"} 1`,
		`rls_decisions_total{domain="api",limit="remote_address/1s",result="ok"} 10`,
		`rls_config_last_reload_successful 1`,
		`rls_store_duration_seconds_bucket`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	code, body = get("/debug/config")
	if code != 200 || !strings.Contains(body, `"remote_address"`) {
		t.Errorf("/debug/config = %d %.200s", code, body)
	}

	post := func(body string) (int, map[string]any) {
		resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, out := post(`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k1"}],"hits_addend":100}]}`)
	if code != 200 || out["overallCode"] != "OK" {
		t.Errorf("/json burst of 100 = %d %v, want 200 OK", code, out)
	}
	code, out = post(`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}`)
	if code != 429 || out["overallCode"] != "OVER_LIMIT" {
		t.Errorf("/json after the burst = %d %v, want 429 OVER_LIMIT", code, out)
	}
	if code, _ := post(`{"domain":`); code != 400 {
		t.Errorf("/json with a bad body = %d, want 400", code)
	}
	if code, _ := post(`{"domain":"api","descriptors":[]}`); code != 400 {
		t.Errorf("/json without descriptors = %d, want 400", code)
	}
}

func TestSighupReload(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	s := startServer(t, nil, "--config", path)
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	ctx := context.Background()
	limit := func() uint32 {
		resp, err := rl.ShouldRateLimit(ctx, rlRequest("d", "k", "v"))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	if got := limit(); got != 1 {
		t.Fatalf("limit before reload = %d, want 1", got)
	}
	writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n")
	if err := syscallKill(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	s.waitUntil(t, "the limit is 7 after SIGHUP", func() bool { return limit() == 7 })
}

func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	for _, tc := range []struct {
		args []string
		env  []string
		want string
		code int
	}{
		{[]string{"serve", "--config", bad}, nil, "bad.yaml:4:24", 1},
		{[]string{"serve", "--config", filepath.Join(dir, "missing.yaml")}, nil, "missing.yaml", 1},
		{[]string{"serve", "--store", "etcd"}, nil, `--store: "etcd" is not one of memory|redis`, 2},
		{[]string{"serve", "--on-store-error", "maybe"}, nil, "--on-store-error", 2},
		{[]string{"serve", "--bogus"}, nil, "flag provided but not defined: -bogus", 2},
		{[]string{"serve"}, []string{"RLS_STORE_TIMEOUT=soon"}, "RLS_STORE_TIMEOUT", 2},
		{[]string{"serve"}, []string{"RLS_RESPONSE_HEADERS=all"}, "RLS_RESPONSE_HEADERS (--response-headers)", 2},
		{[]string{"serve"}, []string{"RLS_STORE=etcd"}, `RLS_STORE (--store): "etcd" is not one of memory|redis`, 2},
		{[]string{"frobnicate"}, nil, `unknown command "frobnicate"`, 2},
	} {
		var stderr bytes.Buffer
		err := run(context.Background(), tc.args, tc.env, io.Discard, &stderr)
		if err == nil {
			t.Errorf("run(%v, %v) = nil, want an error", tc.args, tc.env)
			continue
		}
		msg := err.Error() + stderr.String()
		if !strings.Contains(msg, tc.want) || exitCode(err) != tc.code {
			t.Errorf("run(%v, %v) = %q (exit %d), want it to mention %q (exit %d)", tc.args, tc.env, msg, exitCode(err), tc.want, tc.code)
		}
	}
}

func TestEnvFallback(t *testing.T) {
	o, err := parseServeFlags([]string{"--store-timeout", "3ms"}, []string{
		"RLS_STORE_TIMEOUT=50ms", "RLS_ON_STORE_ERROR=allow", "RLS_RESPONSE_HEADERS=draft11", "RLS_REDIS_CLUSTER=a:1, b:2", "RLS_MEMORY_LIMIT=64MiB",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Store.Redis.Timeout != 3*time.Millisecond {
		t.Errorf("store timeout = %s, want 3ms: the command line wins over RLS_STORE_TIMEOUT", o.Store.Redis.Timeout)
	}
	if o.Service.OnStoreError.String() != "allow" || o.Service.Headers != 2 || fmt.Sprint(o.Store.Redis.ClusterSeeds) != "[a:1 b:2]" || o.Store.Memory.MaxBytes != 64<<20 {
		t.Errorf("from env: on-store-error %s, headers %d, cluster %v, memory %d", o.Service.OnStoreError, o.Service.Headers, o.Store.Redis.ClusterSeeds, o.Store.Memory.MaxBytes)
	}
	// An empty variable is as good as unset: the default stands.
	o, err = parseServeFlags(nil, []string{"RLS_STORE_TIMEOUT=", "RLS_STORE=", "RLS_RESPONSE_HEADERS="}, io.Discard)
	if err != nil {
		t.Fatalf("empty variables: %v, want the defaults", err)
	}
	if o.Store.Redis.Timeout != 10*time.Millisecond || o.Store.Kind != "memory" {
		t.Errorf("empty variables: store timeout %s, store %q; want the defaults 10ms, memory", o.Store.Redis.Timeout, o.Store.Kind)
	}
}

// The serve flags' defaults are the server's (daemon.Defaults): the flags
// that take their default's text (policies, headers, access, log level)
// parse to the same values, and nothing else differs but the names of the
// settings in errors.
func TestFlagDefaultsAreDaemonDefaults(t *testing.T) {
	got, err := parseServeFlags(nil, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got.Names = daemon.Names{}
	if want := daemon.Defaults(); !reflect.DeepEqual(got, want) {
		t.Errorf("parseServeFlags(no flags) =\n%+v\nwant daemon.Defaults() =\n%+v", got, want)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: hour, requests_per_unit: 9}\n")
	bad := writeFile(t, dir, "bad.yaml", "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n")

	var out bytes.Buffer
	if err := run(context.Background(), []string{"validate", good}, nil, &out, io.Discard); err != nil {
		t.Fatalf("validate good.yaml = %v", err)
	}
	if got := out.String(); !strings.HasPrefix(got, "d: ok: 1 descriptors, 2 limits") {
		t.Errorf("validate good.yaml printed %q", got)
	}

	out.Reset()
	err := run(context.Background(), []string{"validate", good, bad}, nil, &out, io.Discard)
	if err == nil || exitCode(err) != 1 {
		t.Fatalf("validate bad.yaml = %v (exit %d), want exit 1", err, exitCode(err))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 2 {
		t.Fatalf("validate bad.yaml printed %q, want one line per problem", out.String())
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, bad+":") {
			t.Errorf("problem line %q does not start with path:line:col", l)
		}
	}
	// A path that cannot be read is a problem line too, and the other
	// files are still checked.
	out.Reset()
	missing := filepath.Join(dir, "missing.yaml")
	err = run(context.Background(), []string{"validate", missing, bad}, nil, &out, io.Discard)
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if exitCode(err) != 1 || len(lines) != 4 || lines[0] != missing+":1:1: cannot read: no such file or directory" || !strings.HasPrefix(lines[2], bad+":") {
		t.Errorf("validate missing.yaml bad.yaml = exit %d, %q; want exit 1, the missing file's line, then bad.yaml's 3", exitCode(err), out.String())
	}
	if err := run(context.Background(), []string{"validate"}, nil, io.Discard, io.Discard); exitCode(err) != 2 {
		t.Errorf("validate without paths: exit %d, want 2", exitCode(err))
	}
	if err := run(context.Background(), []string{"validate", "../../config/limits.yaml"}, nil, io.Discard, io.Discard); err != nil {
		t.Errorf("validate config/limits.yaml = %v", err)
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, nil, &out, io.Discard); err != nil || !strings.HasPrefix(out.String(), "rls ") {
		t.Errorf("version = %v, %q", err, out.String())
	}
}

func TestDrainOnShutdown(t *testing.T) {
	s := startServer(t, nil, "--config", "../../config/limits.yaml")
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	// Requests racing the shutdown either complete or are refused cleanly;
	// run() returns nil. The shutdown starts once every worker has had an
	// answer, so that it meets requests in flight.
	var wg sync.WaitGroup
	answered := make(chan struct{}, 8)
	for range 8 {
		wg.Go(func() {
			signal := sync.OnceFunc(func() { answered <- struct{}{} })
			defer signal()
			for range 50 {
				_, err := rl.ShouldRateLimit(context.Background(), rlRequest("api", "remote_address", "10.0.0.1"))
				if err != nil && status.Code(err) != codes.Unavailable {
					t.Errorf("request during shutdown: %v", err)
					return
				}
				signal()
			}
		})
	}
	for range 8 {
		<-answered
	}
	s.stop(t)
	wg.Wait()
	if !strings.Contains(s.logs.String(), "stopped") {
		t.Errorf("logs lack the stop line:\n%s", s.logs)
	}
}

func TestHealthcheck(t *testing.T) {
	s := startServer(t, nil, "--config", "../../config/limits.yaml")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"healthcheck", "http://" + s.httpAddr + "/readyz"}, nil, &out, io.Discard); err != nil {
		t.Errorf("healthcheck of a ready server = %v", err)
	}
	if err := run(context.Background(), []string{"healthcheck", "http://" + servetest.Addr(t) + "/readyz"}, nil, io.Discard, io.Discard); err == nil {
		t.Error("healthcheck of nothing = nil, want an error")
	}
}

func metricValue(t *testing.T, httpAddr, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

func TestReloadOnFileChange(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	s := startServer(t, nil, "--config", dir)
	rl := rlsv3.NewRateLimitServiceClient(s.dial(t))
	limit := func() uint32 {
		resp, err := rl.ShouldRateLimit(context.Background(), rlRequest("d", "k", "v"))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	// An atomic rename, as editors and deploy tools do.
	tmp := writeFile(t, dir, ".limits.yaml.tmp", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	s.waitUntil(t, "limit 5 after an atomic rename", func() bool { return limit() == 5 })

	// A broken file keeps the old config and says so.
	writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 9}\n")
	s.waitUntil(t, "rls_config_last_reload_successful 0", func() bool { return metricValue(t, s.httpAddr, "rls_config_last_reload_successful") == "0" })
	if got := limit(); got != 5 {
		t.Errorf("limit after a bad file = %d, want the old 5", got)
	}
	if !strings.Contains(s.logs.String(), "limits.yaml:4:") || !strings.Contains(s.logs.String(), "fortnight") {
		t.Errorf("the log does not name the bad file's position:\n%s", s.logs)
	}

	// Fixed: loads again.
	writeFile(t, dir, "limits.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 9}\n")
	s.waitUntil(t, "limit 9 after the fix", func() bool { return limit() == 9 })
	if got := metricValue(t, s.httpAddr, "rls_config_last_reload_successful"); got != "1" {
		t.Errorf("rls_config_last_reload_successful = %q after the fix, want 1", got)
	}
}
