package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is the import path of rls's module.
const module = "github.com/rlsproject/rls"

// own turns paths relative to the module into import paths.
func own(paths ...string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = module + "/" + p
	}
	return out
}

// rule is one row of the table: packages of the module, and what they must
// not import. A pattern is an import path, or one ending in "/..." for that
// path and every path below it. Only the packages' own code counts, not
// their tests.
type rule struct {
	what string   // the packages in docs/design.md's words, for messages
	pkgs []string // the module's packages the row is about
	// notImport must not be imported directly (a package may still reach
	// it through another layer: transports reach the engine through the
	// service).
	notImport []string
	// notDepend must not be among the packages' dependencies at all,
	// however far (go list -deps).
	notDepend []string
	// except are left out of notImport and notDepend (the engine's own
	// sub-packages).
	except []string
	// stdOnly: the standard library only.
	stdOnly bool
	// general: a rule over a whole tree; it places no package (every
	// package must be named by a row that is not general).
	general bool
}

// rules is the layering. A new package gets a row, or joins one: the test
// fails for a package that no row names.
func rules() []rule {
	var (
		yaml  = []string{"gopkg.in/yaml.v3", "go.yaml.in/...", "sigs.k8s.io/yaml/..."}
		grpc  = []string{"google.golang.org/grpc/..."}
		redis = []string{"github.com/redis/..."}
		envoy = []string{"github.com/envoyproxy/..."}
		// OpenTelemetry: its API (a trace.Tracer, spans) may be used where
		// spans are made; its SDK and exporters only by internal/tracing,
		// which the running server wires in.
		otel    = []string{"go.opentelemetry.io/..."}
		otelSDK = []string{"go.opentelemetry.io/otel/sdk/...", "go.opentelemetry.io/otel/exporters/..."}
		tracing = own("internal/tracing")
		spans   = own("internal/tracing/spans")
		engine  = own("internal/engine")
		config  = own("internal/config")
		service = own("internal/service")
		// rls's own metrics of decisions: an observer that the running
		// server installs in the service.
		observers  = own("internal/decisionmetrics")
		stores     = own("internal/memstore", "internal/redisstore", "internal/lease")
		transports = own("internal/envoyrls", "internal/authz", "internal/httpapi", "internal/rlqs")
		// The package of the envoyproxy/ratelimit mode (issue 22): nothing
		// in the core may import it, from the day it exists.
		compat = own("internal/compat/...")
		// The running server (issue 22): front ends (cmd/rls, compat)
		// build its Config; nothing below it imports it.
		daemon      = own("internal/daemon/...")
		testSupport = own("internal/servetest", "internal/redistest", "internal/proctest", "internal/testpki",
			"internal/engine/storetest", "internal/xdsconfig/xdstest", "internal/layering", "internal/tracing/otlptest")
	)
	return []rule{
		{
			what:      "the engine (compiled rules, algorithms, the Store interface)",
			pkgs:      own("internal/engine/..."),
			notDepend: slices.Concat(own("..."), yaml, envoy, grpc, redis, otel, []string{"net/http"}),
			except:    own("internal/engine/..."), // its own sub-packages (storetest imports engine)
		},
		{
			what:      "the config model (and its YAML reader, match index, http_descriptors)",
			pkgs:      slices.Concat(config, own("internal/strictyaml", "internal/match", "internal/httpdesc")),
			notDepend: slices.Concat(stores, service, transports, compat, daemon),
		},
		{
			// What the service consults in each decision, and what keeps it:
			// a store hands it records as bytes (its Backend), a transport
			// its changes.
			what:      "the runtime overrides (their model, their index per config, the keeper of their backend)",
			pkgs:      own("internal/overrides"),
			notDepend: slices.Concat(stores, service, transports, observers, compat, daemon, redis, grpc, tracing, otel),
		},
		{
			what:      "the metric series type (rls's metrics and the compatibility package use it)",
			pkgs:      own("internal/series"),
			notDepend: own("..."),
			except:    own("internal/series"),
		},
		{
			what:      "a store",
			pkgs:      stores,
			notDepend: slices.Concat(transports, service, observers, config, compat, daemon, tracing, otelSDK),
		},
		{
			// It knows nothing of rate limiting: the Redis store gives it
			// requests to send and reads their replies.
			what:      "the Redis driver (connections, batching, deadlines in Redis time, cluster redirections, Sentinel)",
			pkgs:      own("internal/redisconn"),
			notDepend: slices.Concat(engine, config, stores, service, transports, compat, daemon, tracing, otel),
		},
		{
			what:      "the service",
			pkgs:      service,
			notDepend: slices.Concat(redis, grpc, stores, transports, observers, compat, daemon, tracing, otelSDK),
			// The Prometheus client brings net/http: the rule is about the
			// service's own code.
			notImport: []string{"net/http"},
		},
		{
			what: "rls's own observers of decisions (its Prometheus metrics, the fullness sample)",
			pkgs: observers,
			// It watches the service's decisions: it knows no wire protocol
			// and no store.
			notDepend: slices.Concat(redis, grpc, envoy, stores, transports, compat, daemon, tracing, otelSDK),
			notImport: []string{"net/http"},
		},
		{
			// Who is limited and what a change would do (issue 37): the top
			// keys and the decision log watch the service's decisions as
			// rls's metrics do. The HTTP transport asks the top keys (GET
			// /debug/top); the board they publish on is the running
			// server's to give, so they know no store.
			// The reload log (issue 38) keeps the last config loads for GET
			// /debug/status as they keep decisions.
			what:      "the top keys, the decision log and the reload log (observers that keep what they saw)",
			pkgs:      own("internal/topkeys", "internal/decisionlog", "internal/reloadlog"),
			notDepend: slices.Concat(redis, grpc, envoy, stores, transports, observers, compat, daemon, tracing, otelSDK),
			notImport: []string{"net/http"},
		},
		{
			what:      "a transport (protocol adapter)",
			pkgs:      transports,
			notImport: engine,
			notDepend: slices.Concat(stores, observers, compat, daemon, tracing, otelSDK),
		},
		{
			what: "the spans helper (how rls's own operations make spans, with OpenTelemetry's API only)",
			pkgs: spans,
			// The service, the stores and the transports use it: it knows
			// none of them, and nothing of the SDK.
			notDepend: slices.Concat(own("..."), otelSDK, grpc),
			except:    spans,
		},
		{
			what: "tracing (the OpenTelemetry SDK, the OTLP exporter, the server spans of the listeners)",
			pkgs: tracing,
			// It knows nothing of rate limiting: the service, stores and
			// transports make their own spans with its tracer.
			notDepend: slices.Concat(engine, config, service, stores, transports, compat, daemon),
		},
		{
			// The operator page (issue 38) is a client of the HTTP API like
			// any other: it reads the endpoints' JSON through the transport's
			// handler and knows nothing of what answers them.
			what:      "the operator page (/ui/)",
			pkgs:      own("internal/ui"),
			notImport: slices.Concat(engine, config, service, stores, observers, own("internal/topkeys", "internal/decisionlog", "internal/reloadlog")),
			notDepend: slices.Concat(stores, compat, daemon, redis),
		},
		{
			what:      "the running server (the typed Config, its store, service, listeners and config source)",
			pkgs:      daemon,
			notDepend: compat,
		},
		{
			what: "the compatibility package (envoyproxy/ratelimit's environment, stats, answers, config sources)",
			pkgs: compat,
		},
		{
			what: "a helper of the program (client address, config watching, gRPC settings, TLS files, xDS source, rls test, rls replay)",
			pkgs: own("internal/clientip", "internal/configwatch", "internal/grpcserver", "internal/tlsfiles",
				"internal/xdsconfig", "internal/ruletest", "internal/replay"),
			notDepend: slices.Concat(compat, daemon),
		},
		{
			what:      "the program",
			pkgs:      own("cmd/rls"),
			notDepend: slices.Concat(testSupport, []string{"testing"}),
		},
		{
			what: "test support",
			pkgs: testSupport,
		},
		{
			what:    "the process harness of tests and benchmarks (deploy/, a module of its own, imports it)",
			pkgs:    own("internal/proctest"),
			stdOnly: true,
		},
		{
			what:      "an internal package",
			pkgs:      own("internal/..."),
			notDepend: own("cmd/..."),
			general:   true,
		},
		{
			what: "tests, examples and tools outside the program (and the operator page's browser test)",
			pkgs: own("bench/...", "docs", "e2e", "envoy", "nginx", "scripts/...", "internal/ui/browser"),
		},
	}
}

// exception is a known break of a rule, with its reason; the test fails
// when it no longer happens, so that it is removed with the cause.
type exception struct{ from, to, why string }

func exceptions() []exception {
	return []exception{
		{module + "/internal/envoyrls", module + "/internal/engine",
			"engine.Unit: service.Request's override names the engine's unit, and RateLimitResponse's units map to it; it goes when the service or the config offers the units"},
	}
}

// pkg is a package of the import graph.
type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string
	Module     *struct{ Main bool }
	Error      *struct{ Err string }
}

// graph is the import graph of the module's packages and their
// dependencies, without tests.
type graph map[string]*pkg

// load lists the module's packages with every dependency.
func load(t *testing.T) graph {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-deps", "-json=ImportPath,Standard,Imports,Module,Error", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading go list: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		g[p.ImportPath] = &p
	}
	return g
}

// rel is a path as the table writes it: relative to the module for its
// packages.
func rel(path string) string {
	if path == module {
		return "."
	}
	return strings.TrimPrefix(path, module+"/")
}

// matches reports whether import path path matches pattern.
func matches(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func matchesAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return matches(p, path) })
}

// pathTo finds the shortest import chain from the package from to a
// package that forbidden accepts, written as the table writes paths.
func (g graph) pathTo(from string, forbidden func(string) bool) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		p := g[cur]
		if p == nil {
			continue
		}
		for _, imp := range p.Imports {
			if _, seen := prev[imp]; seen {
				continue
			}
			prev[imp] = cur
			if forbidden(imp) {
				var path []string
				for at := imp; at != ""; at = prev[at] {
					path = append(path, rel(at))
				}
				slices.Reverse(path)
				return path
			}
			queue = append(queue, imp)
		}
	}
	return nil
}

// deps lists every package that from depends on, however far.
func (g graph) deps(from string) []string {
	seen := map[string]bool{from: true}
	queue := []string{from}
	var out []string
	for len(queue) > 0 {
		p := g[queue[0]]
		queue = queue[1:]
		if p == nil {
			continue
		}
		for _, imp := range p.Imports {
			if !seen[imp] {
				seen[imp] = true
				out = append(out, imp)
				queue = append(queue, imp)
			}
		}
	}
	slices.Sort(out)
	return out
}

// check returns every break of the rules in g, and every exception that
// no longer happens.
func check(g graph, rs []rule, exs []exception) []string {
	var problems []string
	var own []string
	for path, p := range g {
		if p.Module != nil && p.Module.Main {
			own = append(own, path)
		}
	}
	slices.Sort(own)
	used := make([]bool, len(exs))
	excepted := func(from, to string) bool {
		for i, e := range exs {
			if matches(e.from, from) && matches(e.to, to) {
				used[i] = true
				return true
			}
		}
		return false
	}
	for _, path := range own {
		placed := false
		for _, r := range rs {
			if !matchesAny(r.pkgs, path) {
				continue
			}
			placed = placed || !r.general
			for _, imp := range g[path].Imports {
				if matchesAny(r.notImport, imp) && !matchesAny(r.except, imp) && !excepted(path, imp) {
					problems = append(problems, fmt.Sprintf("%s imports %s; %s must not import it (docs/design.md section 1, layering_test.go)", rel(path), rel(imp), r.what))
				}
			}
			// One line for each forbidden package that the rule's
			// patterns catch nearest, with how many more that pattern
			// catches.
			for _, pattern := range r.notDepend {
				bad := func(dep string) bool {
					return matches(pattern, dep) && !matchesAny(r.except, dep) && !excepted(path, dep)
				}
				var caught []string
				for _, dep := range g.deps(path) {
					if bad(dep) {
						caught = append(caught, dep)
					}
				}
				if len(caught) == 0 {
					continue
				}
				chain := g.pathTo(path, bad)
				more := ""
				if len(caught) > 1 {
					more = fmt.Sprintf(" (and %d more packages of %s)", len(caught)-1, rel(pattern))
				}
				problems = append(problems, fmt.Sprintf("%s depends on %s%s; %s must not (docs/design.md section 1, layering_test.go): %s",
					rel(path), chain[len(chain)-1], more, r.what, strings.Join(chain, " → ")))
			}
			if r.stdOnly {
				for _, dep := range g.deps(path) {
					// "C" is cgo's, which net uses where cgo is on.
					if d := g[dep]; dep != "C" && (d == nil || !d.Standard) {
						chain := g.pathTo(path, func(p string) bool { return p == dep })
						problems = append(problems, fmt.Sprintf("%s depends on %s; %s imports the standard library only: %s",
							rel(path), rel(dep), r.what, strings.Join(chain, " → ")))
						break
					}
				}
			}
		}
		if !placed {
			problems = append(problems, fmt.Sprintf("%s is in no row of the layering table: add it to its layer's row in internal/layering/layering_test.go (docs/design.md section 1)", rel(path)))
		}
	}
	for i, e := range exs {
		if !used[i] {
			problems = append(problems, fmt.Sprintf("exception %s → %s no longer happens: remove it from internal/layering/layering_test.go", rel(e.from), rel(e.to)))
		}
	}
	return problems
}

// TestLayering checks the module's import graph against the table.
func TestLayering(t *testing.T) {
	for _, p := range check(load(t), rules(), exceptions()) {
		t.Error(p)
	}
}

// TestCheckCatches runs the checker on made-up graphs: each break of a
// rule is reported with the package, what it must not reach, and the chain
// of imports that reaches it; a package no row names, a stale exception,
// and what the rules allow pass or fail as they should.
func TestCheckCatches(t *testing.T) {
	m := func(p string) string { return module + "/" + p }
	// imports builds a graph from "a b c" lines: a imports b and c. Paths
	// with a dot are another module's, "std:" marks the standard library,
	// others are the module's.
	imports := func(lines ...string) graph {
		g := map[string]*pkg{}
		name := func(s string) string {
			switch {
			case strings.HasPrefix(s, "std:"):
				return strings.TrimPrefix(s, "std:")
			case strings.Contains(s, "."):
				return s
			}
			return m(s)
		}
		add := func(s string) *pkg {
			n := name(s)
			if g[n] == nil {
				p := &pkg{ImportPath: n, Standard: strings.HasPrefix(s, "std:")}
				if !p.Standard && !strings.Contains(s, ".") {
					p.Module = &struct{ Main bool }{true}
				}
				g[n] = p
			}
			return g[n]
		}
		for _, l := range lines {
			f := strings.Fields(l)
			p := add(f[0])
			for _, imp := range f[1:] {
				add(imp)
				p.Imports = append(p.Imports, name(imp))
			}
		}
		return g
	}
	envoyrlsException := exceptions()
	for _, tc := range []struct {
		name  string
		g     graph
		exs   []exception
		wants []string // substrings of the problems, one problem each; none: no problem
	}{
		{"clean", imports(
			"internal/engine std:fmt",
			"internal/engine/storetest internal/engine std:testing",
			"internal/config internal/engine gopkg.in/yaml.v3",
			"internal/service internal/config internal/engine github.com/prometheus/client_golang/prometheus",
			"github.com/prometheus/client_golang/prometheus std:net/http",
			"internal/envoyrls internal/service internal/engine google.golang.org/grpc",
			"internal/memstore internal/engine",
			"cmd/rls internal/envoyrls internal/memstore",
		), envoyrlsException, nil},
		{"engine reaches YAML through the config", imports(
			"internal/engine internal/config",
			"internal/config gopkg.in/yaml.v3",
		), nil, []string{
			"internal/engine depends on internal/config; the engine (compiled rules, algorithms, the Store interface) must not (docs/design.md section 1, layering_test.go): internal/engine → internal/config",
			"internal/engine depends on gopkg.in/yaml.v3; the engine (compiled rules, algorithms, the Store interface) must not (docs/design.md section 1, layering_test.go): internal/engine → internal/config → gopkg.in/yaml.v3",
		}},
		{"engine reaches gRPC through another module", imports(
			"internal/engine example.com/x",
			"example.com/x google.golang.org/grpc google.golang.org/grpc/codes",
		), nil, []string{
			"internal/engine depends on google.golang.org/grpc (and 1 more packages of google.golang.org/grpc/...); the engine (compiled rules, algorithms, the Store interface) must not (docs/design.md section 1, layering_test.go): internal/engine → example.com/x → google.golang.org/grpc",
		}},
		{"service imports net/http itself", imports(
			"internal/service std:net/http",
		), nil, []string{"internal/service imports net/http; the service must not import it"}},
		{"the server imports the compatibility package", imports(
			"internal/daemon internal/service",
			"internal/service",
			"internal/compat internal/daemon",
			"internal/daemon/x internal/compat",
		), nil, []string{"internal/daemon/x depends on internal/compat; the running server (the typed Config, its store, service, listeners and config source) must not"}},
		{"the service imports the server", imports(
			"internal/service internal/daemon",
			"internal/daemon",
		), nil, []string{"internal/service depends on internal/daemon; the service must not"}},
		{"service imports the compatibility package", imports(
			"internal/service internal/compat",
			"internal/compat",
		), nil, []string{"internal/service depends on internal/compat; the service must not"}},
		{"a transport imports the engine", imports(
			"internal/authz internal/engine",
			"internal/engine",
		), nil, []string{"internal/authz imports internal/engine; a transport (protocol adapter) must not import it"}},
		{"an exception covers its own pair only", imports(
			"internal/envoyrls internal/engine",
			"internal/httpapi internal/engine",
			"internal/engine",
		), envoyrlsException, []string{"internal/httpapi imports internal/engine"}},
		{"a store reaches the service", imports(
			"internal/redisstore internal/tlsfiles",
			"internal/tlsfiles internal/service",
			"internal/service",
			"internal/clientip",
		), nil, []string{"internal/redisstore depends on internal/service; a store must not (docs/design.md section 1, layering_test.go): internal/redisstore → internal/tlsfiles → internal/service"}},
		{"internal imports cmd", imports(
			"internal/grpcserver cmd/rls",
			"cmd/rls",
		), nil, []string{"internal/grpcserver depends on cmd/rls; an internal package must not"}},
		{"the program reaches test support", imports(
			"cmd/rls internal/service",
			"internal/service internal/servetest",
			"internal/servetest std:testing",
		), nil, []string{
			"cmd/rls depends on internal/servetest; the program must not (docs/design.md section 1, layering_test.go): cmd/rls → internal/service → internal/servetest",
			"cmd/rls depends on testing; the program must not",
		}},
		{"the harness imports beyond the standard library", imports(
			"internal/proctest std:os internal/testpki",
			"internal/testpki",
		), nil, []string{"internal/proctest depends on internal/testpki; the process harness of tests and benchmarks (deploy/, a module of its own, imports it) imports the standard library only: internal/proctest → internal/testpki"}},
		{"a package no row names", imports(
			"internal/yamlx gopkg.in/yaml.v3",
		), nil, []string{"internal/yamlx is in no row of the layering table"}},
		{"a stale exception", imports(
			"internal/envoyrls internal/service",
			"internal/service",
		), envoyrlsException, []string{"exception internal/envoyrls → internal/engine no longer happens"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := check(tc.g, rules(), tc.exs)
			if len(got) != len(tc.wants) {
				t.Errorf("%d problems, want %d:\n%s", len(got), len(tc.wants), strings.Join(got, "\n"))
			}
			for _, w := range tc.wants {
				if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, w) }) {
					t.Errorf("no problem says %q; got:\n%s", w, strings.Join(got, "\n"))
				}
			}
		})
	}
}
