package deploy_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/proctest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// objects are the typed objects of one kustomize build.
type objects struct {
	configMaps  map[string]*corev1.ConfigMap
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	pdbs        map[string]*policyv1.PodDisruptionBudget
}

// build runs kustomize on dir, as kubectl apply -k does, and decodes every
// object strictly into its Kubernetes API type: an unknown or misplaced
// field, or a kind this test does not know, fails.
func build(t *testing.T, dir string) objects {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out := objects{map[string]*corev1.ConfigMap{}, map[string]*appsv1.Deployment{}, map[string]*corev1.Service{}, map[string]*policyv1.PodDisruptionBudget{}}
	for _, r := range rm.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var meta struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		var obj interface{ GetName() string }
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "apps/v1 Deployment":
			obj = &appsv1.Deployment{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "policy/v1 PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		default:
			t.Fatalf("%s: %s %s is not a kind this test checks", dir, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Errorf("%s: %s %s: %v\n%s", dir, meta.Kind, r.GetName(), err, doc)
			continue
		}
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			out.configMaps[o.Name] = o
		case *appsv1.Deployment:
			out.deployments[o.Name] = o
		case *corev1.Service:
			out.services[o.Name] = o
		case *policyv1.PodDisruptionBudget:
			out.pdbs[o.Name] = o
		}
	}
	return out
}

// TestStrictDecodingCatches: the decoding above refuses a misspelt field.
func TestStrictDecodingCatches(t *testing.T) {
	bad := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n")
	if err := yaml.UnmarshalStrict(bad, &appsv1.Deployment{}); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Errorf("strict decoding of spec.replica = %v, want an unknown-field error", err)
	}
}

// flagsOf parses a container's args, `serve` then --flag=value items.
func flagsOf(t *testing.T, args []string) map[string]string {
	t.Helper()
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("args %q: want serve first", args)
	}
	flags := map[string]string{}
	for _, a := range args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Fatalf("arg %q: write --flag=value, so that this test and readers see each pair", a)
		}
		if _, dup := flags[name]; dup {
			t.Errorf("--%s given twice", name)
		}
		flags[name] = value
	}
	return flags
}

func port(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return int32(n)
}

// containerPort resolves a probe's or service's named or numbered port.
func containerPort(c *corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// checkRLS checks the rls objects of one build and returns the rls
// container and the ConfigMap files for running.
func checkRLS(t *testing.T, o objects, wantReplicas int32) (*corev1.Container, map[string]string) {
	t.Helper()
	d := o.deployments["rls"]
	if d == nil {
		t.Fatal("no Deployment rls")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != wantReplicas {
		t.Errorf("Deployment rls: replicas %v, want %d", d.Spec.Replicas, wantReplicas)
	}
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel := func(what string, ls map[string]string) {
		if len(ls) == 0 || !labels.SelectorFromSet(ls).Matches(podLabels) {
			t.Errorf("%s: selector %v does not select the rls pods (labels %v)", what, ls, podLabels)
		}
	}
	sel("Deployment rls", d.Spec.Selector.MatchLabels)
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment rls: %d containers, want 1", len(d.Spec.Template.Spec.Containers))
	}
	c := &d.Spec.Template.Spec.Containers[0]
	flags := flagsOf(t, c.Args)

	// Listeners, ports, probes.
	httpPort, grpcPort := port(t, flags["http-addr"]), port(t, flags["grpc-addr"])
	for _, p := range []struct {
		name string
		want int32
	}{{"http", httpPort}, {"grpc", grpcPort}} {
		if got, ok := containerPort(c, intstr.FromString(p.name)); !ok || got != p.want {
			t.Errorf("container port %q = %d (found %v), want %d (--%s-addr)", p.name, got, ok, p.want, p.name)
		}
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe of %s", pr.name, pr.path)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path {
			t.Errorf("%s: path %q, want %q", pr.name, pr.probe.HTTPGet.Path, pr.path)
		}
		if got, ok := containerPort(c, pr.probe.HTTPGet.Port); !ok || got != httpPort {
			t.Errorf("%s: port %v is %d, want rls's HTTP port %d", pr.name, pr.probe.HTTPGet.Port.String(), got, httpPort)
		}
	}
	if a := d.Spec.Template.Annotations; a["prometheus.io/port"] != strconv.Itoa(int(httpPort)) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("prometheus.io annotations %v: want port %d, path /metrics", a, httpPort)
	}

	// Services and the PDB.
	for _, name := range []string{"rls", "rls-headless"} {
		s := o.services[name]
		if s == nil {
			t.Errorf("no Service %s", name)
			continue
		}
		sel("Service "+name, s.Spec.Selector)
		for _, sp := range s.Spec.Ports {
			got, ok := containerPort(c, sp.TargetPort)
			want := map[string]int32{"grpc": grpcPort, "http": httpPort}[sp.Name]
			if !ok || got != want || sp.Port != want {
				t.Errorf("Service %s port %s: %d -> %s (container port %d), want %d -> %d", name, sp.Name, sp.Port, sp.TargetPort.String(), got, want, want)
			}
		}
	}
	if s := o.services["rls"]; s != nil && len(s.Spec.Ports) != 2 {
		t.Errorf("Service rls: %d ports, want grpc and http", len(s.Spec.Ports))
	}
	if s := o.services["rls-headless"]; s != nil && s.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service rls-headless: clusterIP %q, want None (Envoy's STRICT_DNS sees every pod)", s.Spec.ClusterIP)
	}
	if pdb := o.pdbs["rls"]; pdb == nil {
		t.Error("no PodDisruptionBudget rls")
	} else {
		sel("PodDisruptionBudget rls", pdb.Spec.Selector.MatchLabels)
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() < 1 {
			t.Errorf("PodDisruptionBudget rls: maxUnavailable %v, want at least 1 (a single replica must stay drainable)", pdb.Spec.MaxUnavailable)
		}
	}

	// Security and resources.
	pod := d.Spec.Template.Spec
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Error("rls container: no securityContext")
	default:
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Error("rls container: runAsNonRoot is not true")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Error("rls container: readOnlyRootFilesystem is not true")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("rls container: allowPrivilegeEscalation is not false")
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("rls container: capabilities %+v, want drop [ALL] and nothing added", sc.Capabilities)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Error("rls container: privileged")
		}
	}
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsUser == nil || *pod.SecurityContext.RunAsUser == 0 {
		t.Error("rls pod: runAsUser is not a non-root uid")
	}
	mem, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok || c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("rls container: resources %+v, want cpu and memory requests and a memory limit", c.Resources)
	}
	if ml, err := resource.ParseQuantity(strings.Replace(flags["memory-limit"], "iB", "i", 1)); err != nil {
		t.Errorf("--memory-limit=%s: %v", flags["memory-limit"], err)
	} else if ok && mem.Cmp(ml) <= 0 {
		t.Errorf("memory limit %s is not above --memory-limit=%s (the store's bound, not the process's)", mem.String(), flags["memory-limit"])
	}
	shutdown := flags["shutdown-timeout"]
	if pod.TerminationGracePeriodSeconds == nil || shutdown == "" {
		t.Errorf("want terminationGracePeriodSeconds and --shutdown-timeout")
	} else {
		secs, err := strconv.Atoi(strings.TrimSuffix(shutdown, "s"))
		pre := int64(0)
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			pre = c.Lifecycle.PreStop.Sleep.Seconds
		}
		if err != nil || *pod.TerminationGracePeriodSeconds <= int64(secs)+pre {
			t.Errorf("terminationGracePeriodSeconds %d, want more than preStop %ds + --shutdown-timeout=%s (else the kubelet kills a draining rls)", *pod.TerminationGracePeriodSeconds, pre, shutdown)
		}
	}

	// The limits: a ConfigMap mounted whole at --config.
	var vol *corev1.Volume
	for i := range pod.Volumes {
		if pod.Volumes[i].ConfigMap != nil {
			vol = &pod.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatal("rls pod: no ConfigMap volume")
	}
	cm := o.configMaps[vol.ConfigMap.Name]
	if cm == nil {
		t.Fatalf("ConfigMap %s (the volume's) is not in the build", vol.ConfigMap.Name)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name != vol.Name {
			continue
		}
		mounted = true
		if m.MountPath != flags["config"] {
			t.Errorf("limits mounted at %s, --config=%s", m.MountPath, flags["config"])
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Errorf("limits mounted with a subPath: such a mount never sees ConfigMap updates")
		}
		if !m.ReadOnly {
			t.Errorf("limits mount is not read-only")
		}
	}
	if !mounted {
		t.Errorf("the limits volume is not mounted in the rls container")
	}
	if len(cm.Data) == 0 {
		t.Fatalf("ConfigMap %s has no data", cm.Name)
	}
	return c, cm.Data
}

// runContainer runs rls with the container's args as they are, but for the
// addresses (free loopback ports), the config (the ConfigMap's files, laid
// out as the kubelet does: ..data a symlink to a timestamped directory) and
// the Redis URL (redisAddr when not empty). It checks the probes' paths,
// then that SIGTERM ends it with exit status 0.
func runContainer(t *testing.T, c *corev1.Container, files map[string]string, redisAddr string) {
	t.Helper()
	dir := writeConfigMap(t, files)
	httpAddr, grpcAddr := proctest.Addr(t), proctest.Addr(t)
	args := slices.Clone(c.Args)
	for i, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		switch name {
		case "http-addr":
			args[i] = "--http-addr=" + httpAddr
		case "grpc-addr":
			args[i] = "--grpc-addr=" + grpcAddr
		case "config":
			args[i] = "--config=" + dir
		case "redis-url":
			if redisAddr == "" {
				t.Fatalf("%s: a Redis URL but no Redis to run it with", a)
			}
			args[i] = "--redis-url=redis://" + redisAddr + "/0"
		}
	}
	p := proctest.StartRLS(t, httpAddr, args...)
	for _, pr := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		code, body, err := get("http://" + httpAddr + pr.HTTPGet.Path)
		if err != nil || code != http.StatusOK {
			t.Errorf("GET %s = %d %q, %v; want 200", pr.HTTPGet.Path, code, body, err)
		}
	}
	// The store the args chose is the one serving.
	_, metrics, err := get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	wantMetric := "rls_memstore_counters"
	if redisAddr != "" {
		wantMetric = "rls_redis_decisions_total"
	}
	if !strings.Contains(metrics, "\n"+wantMetric+" ") {
		t.Errorf("/metrics has no %s: the args did not choose the store expected", wantMetric)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("rls: %v\n%s", err, p.Output())
	}
}

// writeConfigMap lays files out as the kubelet mounts a ConfigMap.
func writeConfigMap(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := "..2026_11_24_00_00_00.000000001"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// validate runs `rls validate` on the ConfigMap's files.
func validate(t *testing.T, files map[string]string) {
	t.Helper()
	dir := writeConfigMap(t, files)
	out, err := exec.Command(proctest.RLSBinary(t), "validate", dir).CombinedOutput()
	if err != nil {
		t.Errorf("rls validate (the ConfigMap's files): %v\n%s", err, out)
	}
}

// TestKubernetes: deploy/kubernetes/base, the memory store.
func TestKubernetes(t *testing.T) {
	o := build(t, "kubernetes/base")
	c, files := checkRLS(t, o, 1)
	if _, ok := flagsOf(t, c.Args)["store"]; ok {
		t.Errorf("the base names a --store; it runs the default memory store")
	}
	if len(o.deployments) != 1 || len(o.services) != 2 || len(o.configMaps) != 1 || len(o.pdbs) != 1 {
		t.Errorf("objects: %d Deployments, %d Services, %d ConfigMaps, %d PDBs; want 1, 2, 1, 1", len(o.deployments), len(o.services), len(o.configMaps), len(o.pdbs))
	}
	// The ConfigMap holds the repository's example, unchanged.
	want, err := os.ReadFile("../config/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if files["limits.yaml"] != string(want) {
		t.Errorf("kubernetes/base/limits.yaml differs from config/limits.yaml: copy it again (cp config/limits.yaml deploy/kubernetes/base/)")
	}
	validate(t, files)
	runContainer(t, c, files, "")
}

// TestKubernetesRedis: deploy/kubernetes/redis, three replicas on Redis.
func TestKubernetesRedis(t *testing.T) {
	o := build(t, "kubernetes/redis")
	c, files := checkRLS(t, o, 3)
	flags := flagsOf(t, c.Args)
	if flags["store"] != "redis" {
		t.Errorf("--store=%q, want redis", flags["store"])
	}
	r := o.deployments["rls-redis"]
	s := o.services["rls-redis"]
	if r == nil || s == nil {
		t.Fatal("no Deployment and Service rls-redis")
	}
	if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(r.Spec.Template.Labels)) {
		t.Errorf("Service rls-redis does not select the Redis pod")
	}
	wantURL := fmt.Sprintf("redis://%s:%d/0", s.Name, s.Spec.Ports[0].Port)
	if flags["redis-url"] != wantURL {
		t.Errorf("--redis-url=%s, want %s (the Service)", flags["redis-url"], wantURL)
	}
	rc := &r.Spec.Template.Spec.Containers[0]
	if got, ok := containerPort(rc, s.Spec.Ports[0].TargetPort); !ok || got != 6379 {
		t.Errorf("Service rls-redis targets %s (%d), want the container's 6379", s.Spec.Ports[0].TargetPort.String(), got)
	}
	if sc := rc.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("redis container: securityContext %+v, want read-only root, no privilege escalation, drop ALL", sc)
	}
	// Redis's own flags, run by the redis-server here: --save "" and the rest.
	checkRedisArgs(t, rc.Args)
	redisAddr, _ := proctest.StartRedis(t)
	runContainer(t, c, files, redisAddr)
}

// checkRedisArgs runs redis-server with the manifest's arguments (and a
// free port) and asks CONFIG GET for each, so that a typo fails.
func checkRedisArgs(t *testing.T, args []string) {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli not found: install redis-tools")
	}
	addr, _ := proctest.StartRedis(t, args...)
	_, portStr, _ := net.SplitHostPort(addr)
	for i := 0; i+1 < len(args); i += 2 {
		name := strings.TrimPrefix(args[i], "--")
		out, err := exec.Command(cli, "-p", portStr, "config", "get", name).Output()
		if err != nil {
			t.Fatalf("redis-cli config get %s: %v", name, err)
		}
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(lines) != 2 || lines[0] != name {
			t.Errorf("redis-server --%s: CONFIG GET answered %q", name, out)
			continue
		}
		got, want := lines[1], args[i+1]
		if name == "maxmemory" {
			q := resource.MustParse(strings.ToUpper(strings.TrimSuffix(want, "mb")) + "Mi")
			want = strconv.FormatInt(q.Value(), 10)
		}
		if !bytes.Equal([]byte(got), []byte(want)) {
			t.Errorf("redis-server --%s %q: CONFIG GET says %q", name, args[i+1], got)
		}
	}
}
