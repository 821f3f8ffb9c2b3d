// Package e2e_test checks the Docker deployment of rls: docker-compose.yaml
// without an engine (compose-spec schema through compose-go, plus the
// wiring between the services, envoy/envoy.yaml and go.mod), the Dockerfile
// and .dockerignore statically, and, where a Docker engine answers, the
// whole stack for real (e2e_test.go).
package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

const (
	root        = ".."
	composeFile = "../docker-compose.yaml"
	envoyFile   = "../envoy/envoy.yaml"
)

// loadCompose loads a compose file with compose-go, as `docker compose
// config` would: the compose-spec JSON schema, interpolation of ${VAR}
// from env only (not from the environment of the test), normalization.
func loadCompose(ctx context.Context, path string, env []string) (*types.Project, error) {
	opts, err := cli.NewProjectOptions([]string{path},
		cli.WithName("rls"),
		cli.WithResolvedPaths(false),
		cli.WithEnv(env),
	)
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(ctx)
}

// envoyImage returns the Envoy image that matches the go-control-plane/envoy
// protos in go.mod: module vX.Y.Z tracks Envoy X.Y.
func envoyImage(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^\s*(?:require\s+)?github\.com/envoyproxy/go-control-plane/envoy v(\d+)\.(\d+)\.\d+`)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			return fmt.Sprintf("envoyproxy/envoy:v%s.%s-latest", m[1], m[2])
		}
	}
	t.Fatal("go.mod does not require github.com/envoyproxy/go-control-plane/envoy")
	return ""
}

// envoyClusters is the part of envoy.yaml the compose wiring depends on.
type envoyClusters struct {
	StaticResources struct {
		Clusters []struct {
			Name           string `json:"name"`
			LoadAssignment struct {
				Endpoints []struct {
					LbEndpoints []struct {
						Endpoint struct {
							Address struct {
								SocketAddress struct {
									Address   string `json:"address"`
									PortValue uint32 `json:"port_value"`
								} `json:"socket_address"`
							} `json:"address"`
						} `json:"endpoint"`
					} `json:"lb_endpoints"`
				} `json:"endpoints"`
			} `json:"load_assignment"`
		} `json:"clusters"`
	} `json:"static_resources"`
}

// wiring is what docker-compose.yaml must connect, from outside it.
type wiring struct {
	envoyImage string
	// envoyYAML is envoy/envoy.yaml's text.
	envoyYAML []byte
}

// flagValues returns the values of --name flags in args ("--name v" or
// "--name=v"), in order.
func flagValues(args []string, name string) []string {
	var out []string
	for i, a := range args {
		switch {
		case a == "--"+name && i+1 < len(args):
			out = append(out, args[i+1])
		case strings.HasPrefix(a, "--"+name+"="):
			out = append(out, strings.TrimPrefix(a, "--"+name+"="))
		}
	}
	return out
}

func mountAt(s types.ServiceConfig, target string) *types.ServiceVolumeConfig {
	for i := range s.Volumes {
		if s.Volumes[i].Target == target {
			return &s.Volumes[i]
		}
	}
	return nil
}

func hasHealthcheck(s types.ServiceConfig) bool {
	return s.HealthCheck != nil && !s.HealthCheck.Disable && len(s.HealthCheck.Test) > 0 && s.HealthCheck.Test[0] != "NONE"
}

// checkCompose returns the wiring problems of p: the services and their
// start order, health checks, the rls command, the mounts, the published
// ports and the Envoy image pin. Paths on the host are taken relative to
// dir.
func checkCompose(p *types.Project, dir string, w wiring) []string {
	var errs []string
	errorf := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }

	if got, want := slices.Sorted(maps.Keys(p.Services)), []string{"backend", "envoy", "redis", "rls"}; !reflect.DeepEqual(got, want) {
		errorf("services %v, want %v", got, want)
	}
	envoy, rls, redis := p.Services["envoy"], p.Services["rls"], p.Services["redis"]

	// Start order: Envoy fails open while rls is away, so it waits for rls
	// to be healthy; rls is ready only when Redis answers.
	wantDeps := map[string]map[string]string{
		"envoy":   {"rls": types.ServiceConditionHealthy, "backend": types.ServiceConditionStarted},
		"rls":     {"redis": types.ServiceConditionHealthy},
		"redis":   {},
		"backend": {},
	}
	for name, want := range wantDeps {
		got := map[string]string{}
		for dep, d := range p.Services[name].DependsOn {
			got[dep] = d.Condition
			if d.Condition == types.ServiceConditionHealthy && !hasHealthcheck(p.Services[dep]) {
				errorf("%s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
			}
		}
		if !reflect.DeepEqual(got, want) {
			errorf("%s: depends_on %v, want %v", name, got, want)
		}
	}
	if !hasHealthcheck(rls) || !slices.Equal(rls.HealthCheck.Test[:min(3, len(rls.HealthCheck.Test))], []string{"CMD", "/rls", "healthcheck"}) {
		errorf("rls: healthcheck must be [CMD /rls healthcheck ...] (the image has no shell or curl)")
	}
	if !hasHealthcheck(redis) || !slices.Equal(redis.HealthCheck.Test, []string{"CMD", "redis-cli", "ping"}) {
		errorf("redis: healthcheck must be [CMD redis-cli ping]")
	}

	// rls: built from this repository, counting in the compose Redis.
	if rls.Build == nil || rls.Build.Context != "." {
		errorf("rls: must be built from this repository (build: context .)")
	} else if _, err := os.Stat(filepath.Join(dir, rls.Build.Context, "Dockerfile")); err != nil {
		errorf("rls: build context has no Dockerfile: %v", err)
	}
	cmd := []string(rls.Command)
	if len(cmd) == 0 || cmd[0] != "serve" {
		errorf("rls: command %q must start with serve", cmd)
	}
	if got := flagValues(cmd, "store"); !slices.Equal(got, []string{"redis"}) {
		errorf("rls: command has --store %q, want redis", got)
	}
	if urls := flagValues(cmd, "redis-url"); len(urls) != 1 {
		errorf("rls: command has --redis-url %q, want one", urls)
	} else if host, port, ok := redisHostPort(urls[0]); !ok || host != "redis" || port != "6379" {
		errorf("rls: --redis-url %s does not name the redis service on 6379", urls[0])
	}
	if cfgs := flagValues(cmd, "config"); len(cfgs) != 1 {
		errorf("rls: command has --config %q, want one", cfgs)
	} else {
		m := mountAt(rls, filepath.Dir(cfgs[0]))
		switch {
		case m == nil:
			errorf("rls: --config %s is not in a mounted directory (mount ./config there so edits reload)", cfgs[0])
		case !m.ReadOnly:
			errorf("rls: the config mount %s must be read-only", m.Target)
		default:
			if _, err := os.Stat(filepath.Join(dir, m.Source, filepath.Base(cfgs[0]))); err != nil {
				errorf("rls: --config %s: not in the mounted host directory: %v", cfgs[0], err)
			}
		}
	}
	if strings.Contains(string(w.envoyYAML), "enable_x_ratelimit_headers: DRAFT_VERSION_03") {
		for _, h := range flagValues(cmd, "response-headers") {
			if h == "draft03" || h == "both" {
				errorf("rls: --response-headers %s repeats the X-RateLimit-* headers Envoy already writes (enable_x_ratelimit_headers: DRAFT_VERSION_03): use draft11 or off", h)
			}
		}
	}

	// envoy: the pinned image, envoy.yaml mounted where the command reads it.
	if envoy.Image != w.envoyImage {
		errorf("envoy: image %q, want %q: envoy.yaml is checked against the protos of the go-control-plane/envoy version in go.mod", envoy.Image, w.envoyImage)
	}
	if m := mountAt(envoy, "/etc/envoy/envoy.yaml"); m == nil || !m.ReadOnly || filepath.Clean(m.Source) != filepath.Join("envoy", "envoy.yaml") {
		errorf("envoy: ./envoy/envoy.yaml must be mounted read-only at /etc/envoy/envoy.yaml")
	}
	if got := flagValues(rewriteShort(envoy.Command), "c"); !slices.Equal(got, []string{"/etc/envoy/envoy.yaml"}) {
		errorf("envoy: command %q must read -c /etc/envoy/envoy.yaml", []string(envoy.Command))
	}
	published := map[uint32]string{}
	for _, port := range envoy.Ports {
		published[port.Target] = port.Published
	}
	for _, target := range []uint32{10000, 10001, 9901} {
		if published[target] == "" {
			errorf("envoy: port %d is not published", target)
		}
	}

	// Every host Envoy sends to is a compose service, on a port it listens on.
	var ec envoyClusters
	if err := yaml.Unmarshal(w.envoyYAML, &ec); err != nil {
		errorf("envoy.yaml: %v", err)
	}
	listens := map[string]string{"rls": "8081", "backend": "80", "redis": "6379"}
	for _, c := range ec.StaticResources.Clusters {
		for _, e := range c.LoadAssignment.Endpoints {
			for _, le := range e.LbEndpoints {
				sa := le.Endpoint.Address.SocketAddress
				if _, ok := p.Services[sa.Address]; !ok {
					errorf("envoy.yaml cluster %s: host %q is not a compose service", c.Name, sa.Address)
				} else if port := fmt.Sprint(sa.PortValue); listens[sa.Address] != port {
					errorf("envoy.yaml cluster %s: %s:%s, but %s listens on %s", c.Name, sa.Address, port, sa.Address, listens[sa.Address])
				}
			}
		}
	}
	if got := flagValues(p.Services["backend"].Command, "port"); len(got) > 0 && got[0] != listens["backend"] {
		errorf("backend: listens on %s, envoy.yaml sends to %s", got[0], listens["backend"])
	}
	return errs
}

// rewriteShort turns Envoy's single-dash flags (-c) into the --c form
// flagValues reads.
func rewriteShort(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if len(a) > 1 && a[0] == '-' && a[1] != '-' {
			a = "-" + a
		}
		out[i] = a
	}
	return out
}

// redisHostPort splits redis://host:port/db.
func redisHostPort(url string) (host, port string, ok bool) {
	rest, found := strings.CutPrefix(url, "redis://")
	if !found {
		return "", "", false
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	hostport, _, _ := strings.Cut(rest, "/")
	host, port, err := net.SplitHostPort(hostport)
	return host, port, err == nil
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestComposeFile(t *testing.T) {
	p, err := loadCompose(t.Context(), composeFile, nil)
	if err != nil {
		t.Fatalf("docker-compose.yaml does not load: %v", err)
	}
	for _, e := range checkCompose(p, root, wiring{envoyImage(t), readFile(t, envoyFile)}) {
		t.Error(e)
	}
	// Default host ports, as the README's curl lines use them.
	want := map[uint32]string{10000: "10000", 10001: "10001", 9901: "9901"}
	for _, port := range p.Services["envoy"].Ports {
		if want[port.Target] != port.Published {
			t.Errorf("envoy: port %d published as %q, want %q", port.Target, port.Published, want[port.Target])
		}
	}
}

// TestComposePortsOverride checks the variables e2e_test.go (and a user
// whose ports are taken) moves the published ports with.
func TestComposePortsOverride(t *testing.T) {
	env := []string{"ENVOY_RATELIMIT_PORT=18000", "ENVOY_EXTAUTHZ_PORT=18001", "ENVOY_ADMIN_PORT=18002", "RLS_HTTP_PORT=18003", "RLS_GRPC_PORT=18004"}
	p, err := loadCompose(t.Context(), composeFile, env)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, name := range []string{"envoy", "rls"} {
		for _, port := range p.Services[name].Ports {
			got[fmt.Sprintf("%s:%d", name, port.Target)] = port.HostIP + "/" + port.Published
		}
	}
	want := map[string]string{
		"envoy:10000": "/18000", "envoy:10001": "/18001", "envoy:9901": "127.0.0.1/18002",
		"rls:8080": "127.0.0.1/18003", "rls:8081": "127.0.0.1/18004",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("published ports (host ip/port) = %v, want %v", got, want)
	}
}

// TestComposeEnvoyImageMatchesProtos pins the Envoy image to the protos
// envoy.yaml is checked against, in the compose file and in envoy.yaml's
// own header, which tells readers which image it is written for.
func TestComposeEnvoyImageMatchesProtos(t *testing.T) {
	want := envoyImage(t)
	p, err := loadCompose(t.Context(), composeFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Services["envoy"].Image; got != want {
		t.Errorf("docker-compose.yaml runs %s; go.mod's go-control-plane/envoy wants %s", got, want)
	}
	if !strings.Contains(string(readFile(t, envoyFile)), want) {
		t.Errorf("envoy/envoy.yaml does not name %s in its comments", want)
	}
}

// TestComposeBroken proves the loader and checkCompose catch typical
// mistakes in docker-compose.yaml.
func TestComposeBroken(t *testing.T) {
	good := string(readFile(t, composeFile))
	w := wiring{envoyImage(t), readFile(t, envoyFile)}
	tests := []struct {
		name, old, new string
		want           string // a regexp one error must match
	}{
		{"misspelled key", "    read_only: true\n", "    read_only: true\n    enviroment: {A: b}\n", `services\.rls\.enviroment false schema`},
		{"bad condition", "condition: service_started", "condition: service_hapy", `services\.envoy\.depends_on\.backend\.condition value must be one of 'service_started', 'service_healthy', 'service_completed_successfully'`},
		{"container port out of range", `:-10000}:10000"`, `:-10000}:100000"`, `(?i)invalid containerPort: 100000`},
		{"rls on the memory store", "      - --store\n      - redis\n", "      - --store\n      - memory\n", `rls: command has --store \["memory"\], want redis`},
		{"envoy does not wait for rls to be healthy", "      rls:\n        condition: service_healthy", "      rls:\n        condition: service_started", `envoy: depends_on .*rls:service_started`},
		{"rls without healthcheck", `      test: ["CMD", "/rls", "healthcheck", "http://127.0.0.1:8080/readyz"]`, `      disable: true`, `envoy waits for rls to be healthy, but rls has no healthcheck`},
		{"older Envoy image", "image: envoyproxy/envoy:v1.40-latest", "image: envoyproxy/envoy:v1.39-latest", `envoy: image "envoyproxy/envoy:v1\.39-latest", want "envoyproxy/envoy:v1\.40-latest"`},
		{"envoy.yaml not mounted", "./envoy/envoy.yaml:/etc/envoy/envoy.yaml:ro", "./envoy/envoy.yaml:/etc/envoy/other.yaml:ro", `envoy: \./envoy/envoy\.yaml must be mounted read-only at /etc/envoy/envoy\.yaml`},
		{"config mounted read-write", "./config:/etc/rls:ro", "./config:/etc/rls", `rls: the config mount /etc/rls must be read-only`},
		{"duplicate X-RateLimit headers", "      - --response-headers\n      - draft11\n", "      - --response-headers\n      - both\n", `--response-headers both repeats the X-RateLimit-\* headers`},
		{"Redis URL to nowhere", "redis://redis:6379/0", "redis://cache:6379/0", `--redis-url redis://cache:6379/0 does not name the redis service`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := strings.Count(good, tt.old); n != 1 {
				t.Fatalf("docker-compose.yaml holds %q %d times, want once: update this variant", tt.old, n)
			}
			path := filepath.Join(t.TempDir(), "docker-compose.yaml")
			if err := os.WriteFile(path, []byte(strings.Replace(good, tt.old, tt.new, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			var problems []string
			p, err := loadCompose(t.Context(), path, nil)
			if err != nil {
				problems = []string{err.Error()}
			} else {
				problems = checkCompose(p, root, w)
			}
			re := regexp.MustCompile(tt.want)
			if !slices.ContainsFunc(problems, re.MatchString) {
				t.Fatalf("problems %q, want one matching %s", problems, tt.want)
			}
			t.Logf("caught: %s", strings.Join(problems, "; "))
		})
	}
}
