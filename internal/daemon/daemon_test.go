package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/httpapi"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// testConfig is Defaults on loopback addresses chosen by the kernel, the
// files of path unwatched, the memory store's clock stopped at
// storetest.T0.
func testConfig(path string) Config {
	c := Defaults()
	c.Listeners.GRPCAddr, c.Listeners.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	c.Listeners.ShutdownTimeout = 5 * time.Second
	c.Files.Path, c.Files.Watch = path, false
	c.Store.Memory.Now = storetest.NewClock(storetest.T0).Now
	return c
}

// running is a server that Run serves, stopped when the test ends.
type running struct {
	*Server
	grpcAddr, httpAddr string
	logs               *servetest.SyncBuffer
	cancel             context.CancelFunc
	done               chan error
}

// start starts a server on cfg and runs it until the test ends (or stop).
func start(t *testing.T, cfg Config) *running {
	t.Helper()
	logs := &servetest.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(ctx, cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		cancel()
		t.Fatalf("New: %v", err)
	}
	g, h := s.Addrs()
	r := &running{Server: s, grpcAddr: g.String(), httpAddr: h.String(), logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("server logs:\n%s", logs)
		}
	})
	return r
}

// stop ends Run's context and returns what Run returned (an error of its
// own when it did not return within 20 s).
func (r *running) stop() error {
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the next stop
		if err != nil {
			return fmt.Errorf("Run = %v after its context ended, want nil", err)
		}
		return nil
	case <-time.After(20 * time.Second):
		return fmt.Errorf("Run did not return within 20s of its context's end")
	}
}

// limit returns the requests_per_unit of the limit that d: k=v gets.
func (r *running) limit(t *testing.T) uint32 {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	resp, err := rlsv3.NewRateLimitServiceClient(servetest.Dial(t, r.grpcAddr)).ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(d, k=v): %v", err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// get returns the status and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func limitsFile(n int) string {
	return fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A server on rls's own file source serves its config, reloads it when
// asked (Server.Reload: the program's SIGHUP), and drains when its context
// ends: Run returns nil.
func TestServeFilesReloadWhenAsked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, limitsFile(1))
	r := start(t, testConfig(path))
	if got := r.limit(t); got != 1 {
		t.Fatalf("limit = %d, want 1", got)
	}
	if code, body := get(t, "http://"+r.httpAddr+"/healthcheck"); code != 200 || body != "OK" {
		t.Errorf("GET /healthcheck = %d %q, want 200 OK", code, body)
	}
	writeFile(t, path, limitsFile(7))
	r.Reload("test")
	servetest.Eventually(t, "the limit is 7 after Reload", func() bool { return r.limit(t) == 7 })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"test: reloading config", "shutting down", "stopped"} {
		if !strings.Contains(r.logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, r.logs)
		}
	}
}

// fakeSource is a Source that starts with no config and loads what the
// test sends on configs; it records the reloads it is asked for.
type fakeSource struct {
	configs chan *config.Config
	asked   chan string
}

func (f *fakeSource) Initial(*slog.Logger) (*config.Config, error) { return nil, nil }

func (f *fakeSource) Run(ctx context.Context, to Target, asked <-chan string, _ *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case why := <-asked:
			f.asked <- why
		case cfg := <-f.configs:
			to.Reload(func() (*config.Config, error) { return cfg, nil })
		}
	}
}

// countingObserver counts the decisions the service tells it of.
type countingObserver struct{ decided atomic.Int64 }

func (*countingObserver) ForConfig(*config.Config) any { return nil }
func (*countingObserver) Reloaded(error)               {}
func (o *countingObserver) Decided(any, *service.Decision) {
	o.decided.Add(1)
}
func (*countingObserver) Cleared(any, *service.Cleared) {}

// The plug-in points: a Source that starts with no config (/healthcheck
// and /readyz say not ready until it brings one) and is told of the
// reloads asked; Plugins.Start given the store, the service's policies and
// the registry, its observer told of decisions and its metrics on
// /metrics; an extra listener given the service, bounded to
// MaxExtraConnections.
func TestPlugins(t *testing.T) {
	src := &fakeSource{configs: make(chan *config.Config), asked: make(chan string, 1)}
	obs := &countingObserver{}
	var parts Parts
	cfg := testConfig("")
	cfg.Service.MaxValueSeries = 7
	cfg.Plugins = Plugins{
		Source: src,
		Start: func(p Parts) (Hooks, error) {
			parts = p
			p.Registry.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "plugin_started_total", Help: "A plug-in's metric."}))
			return Hooks{Observers: []service.Observer{obs}}, nil
		},
		Listeners: []Listener{{Name: "extra", Addr: "127.0.0.1:0", Handler: func(svc *service.Service, _ prometheus.Gatherer) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, "domains=%d", len(svc.Config().Domains()))
			})
		}}},
	}
	r := start(t, cfg)
	if parts.Store == nil || parts.Service.MaxValueSeries != 7 || parts.Registry == nil || parts.Logger == nil {
		t.Errorf("Plugins.Start got %+v, want the store, the Service section, the registry and the logger", parts)
	}
	if code, body := get(t, "http://"+r.httpAddr+"/healthcheck"); code != 500 || !strings.Contains(body, "no config loaded") {
		t.Errorf("GET /healthcheck before a config = %d %q, want 500 no config loaded", code, body)
	}
	if code, _ := get(t, "http://"+r.httpAddr+"/readyz"); code != 503 {
		t.Errorf("GET /readyz before a config = %d, want 503", code)
	}
	src.configs <- servetest.Config(t, limitsFile(3))
	servetest.Eventually(t, "GET /healthcheck answers 200 once the source brings a config", func() bool {
		code, _ := get(t, "http://"+r.httpAddr+"/healthcheck")
		return code == 200
	})
	if got := r.limit(t); got != 3 || obs.decided.Load() != 1 {
		t.Errorf("a request: limit %d, observer told of %d decisions; want 3 and 1", got, obs.decided.Load())
	}
	if _, body := get(t, "http://"+r.httpAddr+"/metrics"); !strings.Contains(body, "plugin_started_total 0") {
		t.Errorf("/metrics lacks the plug-in's metric")
	}
	r.Reload("test")
	if why := <-src.asked; why != "test" {
		t.Errorf("the source was asked to reload for %q, want test", why)
	}
	var extra string
	for _, line := range strings.Split(r.logs.String(), "\n") {
		if strings.Contains(line, "listener=extra") {
			_, extra, _ = strings.Cut(line, "addr=")
		}
	}
	if code, body := get(t, "http://"+extra+"/"); code != 200 || body != "domains=1" {
		t.Errorf("the extra listener (%s) answers %d %q, want 200 domains=1", extra, code, body)
	}
}

// A start that fails names the setting (Config.Names, or the listener's
// own name) and releases what it took: here the gRPC and HTTP listeners'
// ports, taken before an extra listener could not listen.
func TestNewFailsNamedAndReleases(t *testing.T) {
	busy := servetest.Listen(t)
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, limitsFile(1))

	cfg := testConfig(path)
	cfg.Listeners.GRPCAddr = busy.Addr().String()
	if _, err := New(context.Background(), cfg, nil); err == nil || !strings.HasPrefix(err.Error(), "gRPC listener: listen tcp") {
		t.Errorf("New with the gRPC address in use: %v, want an error naming the gRPC listener", err)
	}
	cfg.Names.GRPCAddr = "--grpc-addr"
	if _, err := New(context.Background(), cfg, nil); err == nil || !strings.HasPrefix(err.Error(), "--grpc-addr: listen tcp") {
		t.Errorf("New with the gRPC address in use and Names.GRPCAddr: %v, want an error naming --grpc-addr", err)
	}

	cfg = testConfig(path)
	cfg.Listeners.GRPCAddr, cfg.Listeners.HTTPAddr = servetest.Addr(t), servetest.Addr(t)
	cfg.Plugins.Listeners = []Listener{
		{Name: "first", Addr: "127.0.0.1:0", Handler: func(*service.Service, prometheus.Gatherer) http.Handler { return http.NotFoundHandler() }},
		{Name: "EXTRA_ADDR", Addr: busy.Addr().String(), Handler: func(*service.Service, prometheus.Gatherer) http.Handler { return http.NotFoundHandler() }},
	}
	if _, err := New(context.Background(), cfg, nil); err == nil || !strings.HasPrefix(err.Error(), "EXTRA_ADDR: listen tcp") {
		t.Fatalf("New with an extra listener's address in use: %v, want an error naming EXTRA_ADDR", err)
	}
	for _, addr := range []string{cfg.Listeners.GRPCAddr, cfg.Listeners.HTTPAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("after the failed start, %s is still taken: %v", addr, err)
			continue
		}
		l.Close()
	}
}

// The extra listeners take the HTTP listener's limits: an idle keep-alive
// connection is closed after the idle timeout, a request body trickled
// slower than the read timeout is cut off, at most MaxConnections
// connections stay open.
func TestExtraListenerLimits(t *testing.T) {
	lim := extraLimits(httpapi.Limits{ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond, MaxConnections: 1000})
	if lim.MaxConnections != MaxExtraConnections {
		t.Errorf("extraLimits(MaxConnections 1000).MaxConnections = %d, want %d", lim.MaxConnections, MaxExtraConnections)
	}
	if got := extraLimits(httpapi.Limits{MaxConnections: 3}).MaxConnections; got != 3 {
		t.Errorf("extraLimits(MaxConnections 3).MaxConnections = %d, want 3", got)
	}
	s := &Server{cfg: Config{Listeners: Listeners{ShutdownTimeout: time.Second}}, log: slog.New(slog.DiscardHandler)}
	defer s.stopExtras()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok")
	})
	addr, err := s.serveExtra("test", "127.0.0.1:0", h, lim)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	servetest.GetKeepAlive(t, idle, "/")
	if !servetest.ClosedByServer(t, idle) {
		t.Errorf("a keep-alive connection idle past the idle timeout (200ms) is still open after %s", servetest.ReadBound)
	}

	slow, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	io.WriteString(slow, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	// The rest of the body never comes.
	if !servetest.ClosedByServer(t, slow) {
		t.Errorf("a request whose body stalls past the read timeout (200ms): connection still open after %s", servetest.ReadBound)
	}
}

// The HTTP listener's bound on connections defaults to half the open-file
// limit, within [16, 10000].
func TestHTTPConnectionShare(t *testing.T) {
	for _, tc := range []struct {
		nofile uint64
		want   int
	}{{0, 16}, {20, 16}, {1024, 512}, {65536, 10000}} {
		if got := httpConnectionShare(tc.nofile); got != tc.want {
			t.Errorf("httpConnectionShare(%d) = %d, want %d", tc.nofile, got, tc.want)
		}
	}
}

// A plug-in's task (Hooks.Tasks) runs while the server serves; its context
// ends once the drain is done (the gRPC listener closed), and Run returns
// only after it has returned: a task's last flush of stats sees every
// decision.
func TestPluginTasks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeFile(t, path, limitsFile(3))
	var running, returned atomic.Bool
	grpcOpenAtEnd := make(chan bool, 1)
	var grpcAddr string
	cfg := testConfig(path)
	cfg.Plugins.Start = func(Parts) (Hooks, error) {
		return Hooks{Tasks: []func(context.Context){func(ctx context.Context) {
			running.Store(true)
			<-ctx.Done()
			c, err := net.Dial("tcp", grpcAddr)
			if err == nil {
				c.Close()
			}
			grpcOpenAtEnd <- err == nil
			returned.Store(true)
		}}}, nil
	}
	r := start(t, cfg)
	grpcAddr = r.grpcAddr
	if got := r.limit(t); got != 3 {
		t.Fatalf("a request: limit %d, want 3", got)
	}
	servetest.Eventually(t, "the task runs", running.Load)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if !returned.Load() {
		t.Error("Run returned before the task did")
	}
	if <-grpcOpenAtEnd {
		t.Error("the task's context ended while the gRPC listener still accepted connections, want after the drain")
	}
}
