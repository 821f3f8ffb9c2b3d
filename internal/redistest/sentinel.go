package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/testpki"
)

// SentinelConfig asks for a Sentinel deployment; the zero value is a master,
// one replica and three sentinels, without passwords.
type SentinelConfig struct {
	// Replicas of the master (default 1).
	Replicas int
	// Sentinels watching it (default 3; the quorum is a majority).
	Sentinels int
	// Password is the data nodes' requirepass (and their masterauth, and
	// the sentinels' auth-pass).
	Password string
	// SentinelPassword is the sentinels' requirepass (and sentinel-pass,
	// which they use with each other).
	SentinelPassword string
	// DownAfter is how long a master may stay silent before a sentinel
	// takes it for down (default 400 ms).
	DownAfter time.Duration
	// TLS, when set, serves every node and sentinel over TLS only, with
	// the PKI's certificate (for 127.0.0.1), replication included; clients
	// need no certificate.
	TLS *testpki.PKI
	// Proxied puts a FaultProxy in front of each data node, which the
	// sentinels know it by: clients that ask them reach the nodes through
	// the proxies (replication between the nodes is not proxied).
	Proxied bool
}

// Sentinel is a Redis master, its replicas and the Redis Sentinels that
// watch it, all redis-server processes on 127.0.0.1 (a sentinel is
// `redis-server sentinel.conf --sentinel`), stopped when the test ends.
// Sentinels take a master for down after SentinelConfig.DownAfter. Its
// methods may be called from the test's goroutine only.
type Sentinel struct {
	// Name is the master's name in the sentinels' config.
	Name string
	// Nodes are the data nodes: Nodes[0] started as the master, the others
	// as its replicas.
	Nodes []*Server
	// Proxies, with Proxied, stand in front of Nodes (same index).
	Proxies []*FaultProxy
	// Sentinels watch the master.
	Sentinels []*Server
	cfg       SentinelConfig
	tb        testing.TB
}

// StartSentinel starts a master, its replicas (in sync with it) and the
// sentinels, and returns once every sentinel knows every replica and every
// other sentinel, so that a failover can be decided at once.
func StartSentinel(tb testing.TB, c SentinelConfig) *Sentinel {
	tb.Helper()
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.Sentinels <= 0 {
		c.Sentinels = 3
	}
	if c.DownAfter <= 0 {
		c.DownAfter = 400 * time.Millisecond
	}
	bin := serverBinary(tb)
	st := &Sentinel{Name: "rlsmaster", cfg: c, tb: tb}
	for i := range 1 + c.Replicas {
		s := &Server{dir: tb.TempDir(), port: proctest.Port(tb), tb: tb, password: c.Password, tls: c.TLS}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		s.args = proctest.RedisArgs(s.port, s.dir)
		if c.TLS != nil {
			s.args = append(s.args, "--port", "0", "--tls-port", strconv.Itoa(s.port), "--tls-cert-file", c.TLS.Cert, "--tls-key-file", c.TLS.Key,
				"--tls-ca-cert-file", c.TLS.CA, "--tls-auth-clients", "no", "--tls-replication", "yes")
		}
		if c.Password != "" {
			s.args = append(s.args, "--requirepass", c.Password, "--masterauth", c.Password)
		}
		if i > 0 {
			s.args = append(s.args, "--replicaof", "127.0.0.1", strconv.Itoa(st.Nodes[0].port))
		}
		if c.Proxied {
			proxy := StartFaultProxy(tb, s.addr)
			st.Proxies = append(st.Proxies, proxy)
			// What the master tells the sentinels of its replicas.
			s.args = append(s.args, "--replica-announce-ip", "127.0.0.1", "--replica-announce-port", strconv.Itoa(proxy.Port()))
		}
		s.start(bin)
		tb.Cleanup(s.Stop)
		st.Nodes = append(st.Nodes, s)
	}
	for _, r := range st.Nodes[1:] {
		st.waitInfo(r, "replication", "master_link_status:up")
	}
	quorum := c.Sentinels/2 + 1
	monitored := st.Nodes[0].port
	if c.Proxied {
		monitored = st.Proxies[0].Port()
	}
	for range c.Sentinels {
		s := &Server{dir: tb.TempDir(), port: proctest.Port(tb), tb: tb, password: c.SentinelPassword, tls: c.TLS}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		conf := []string{
			"port " + strconv.Itoa(s.port),
			"bind 127.0.0.1",
			"dir " + s.dir,
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", st.Name, monitored, quorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", st.Name, c.DownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", st.Name, 10*c.DownAfter.Milliseconds()),
			"sentinel parallel-syncs " + st.Name + " 1",
		}
		if c.Password != "" {
			conf = append(conf, "sentinel auth-pass "+st.Name+" "+c.Password)
		}
		if c.TLS != nil {
			// TLS to clients, to the data nodes and to the other sentinels.
			conf[0] = "port 0"
			conf = append(conf, "tls-port "+strconv.Itoa(s.port), "tls-cert-file "+c.TLS.Cert, "tls-key-file "+c.TLS.Key,
				"tls-ca-cert-file "+c.TLS.CA, "tls-auth-clients no", "tls-replication yes")
		}
		if c.SentinelPassword != "" {
			conf = append(conf, "requirepass "+c.SentinelPassword, "sentinel sentinel-pass "+c.SentinelPassword)
		}
		path := filepath.Join(s.dir, "sentinel.conf") // sentinels rewrite their config: each its own
		if err := os.WriteFile(path, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
			tb.Fatal(err)
		}
		s.args = []string{path, "--sentinel"}
		s.start(bin)
		tb.Cleanup(s.Stop)
		st.Sentinels = append(st.Sentinels, s)
	}
	st.waitSentinels()
	return st
}

// Addrs returns the sentinels' host:port.
func (st *Sentinel) Addrs() []string {
	var out []string
	for _, s := range st.Sentinels {
		out = append(out, s.addr)
	}
	return out
}

// Spec returns the deployment as envoyproxy/ratelimit's REDIS_URL and
// rls's --redis-sentinel write it: the master's name, then the sentinels.
func (st *Sentinel) Spec() string {
	return strings.Join(append([]string{st.Name}, st.Addrs()...), ",")
}

// Master returns the data node that the first sentinel answering names as
// the master now.
func (st *Sentinel) Master() *Server {
	st.tb.Helper()
	for _, s := range st.Sentinels {
		out, err := s.secureCommand("SENTINEL", "GET-MASTER-ADDR-BY-NAME", st.Name)
		if err != nil {
			continue
		}
		if n := st.node(strings.Replace(out, "\n", ":", 1)); n != nil {
			return n
		}
	}
	st.tb.Fatal("redistest: no sentinel names a master")
	return nil
}

// node returns the data node at addr (its own, or its proxy's), or nil.
func (st *Sentinel) node(addr string) *Server {
	for i, n := range st.Nodes {
		if n.addr == addr || st.Proxies != nil && st.Proxies[i].Addr() == addr {
			return n
		}
	}
	return nil
}

// Proxy returns the proxy in front of node n (Proxied).
func (st *Sentinel) Proxy(n *Server) *FaultProxy {
	st.tb.Helper()
	for i, m := range st.Nodes {
		if m == n && st.Proxies != nil {
			return st.Proxies[i]
		}
	}
	st.tb.Fatalf("redistest: no proxy in front of %s", n.addr)
	return nil
}

// WaitFailover waits until every sentinel still running names another
// master than old, and that node says it is a master; it returns it
// (bounded: 30 s).
func (st *Sentinel) WaitFailover(old *Server) *Server {
	st.tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var master *Server
		agreed := true
		for _, s := range st.Sentinels {
			out, err := s.secureCommand("SENTINEL", "GET-MASTER-ADDR-BY-NAME", st.Name)
			if err != nil {
				continue // a stopped sentinel
			}
			n := st.node(strings.Replace(out, "\n", ":", 1))
			if n == nil || n == old || master != nil && n != master {
				agreed = false
				break
			}
			master = n
		}
		if agreed && master != nil {
			if info, err := master.secureCommand("INFO", "replication"); err == nil && strings.Contains(info, "role:master") {
				return master
			}
		}
		if time.Now().After(deadline) {
			st.tb.Fatalf("redistest: no failover away from %s within 30s\n%s", old.addr, st.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitSentinels waits until every sentinel sees the master up, every
// replica and every other sentinel (bounded: 30 s).
func (st *Sentinel) waitSentinels() {
	st.tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := true
		for _, s := range st.Sentinels {
			out, err := s.secureCommand("SENTINEL", "MASTER", st.Name)
			f := fields(out)
			if err != nil || f["flags"] != "master" || f["num-slaves"] != strconv.Itoa(st.cfg.Replicas) ||
				f["num-other-sentinels"] != strconv.Itoa(st.cfg.Sentinels-1) {
				ready = false
				break
			}
		}
		if ready {
			return
		}
		if time.Now().After(deadline) {
			st.tb.Fatalf("redistest: sentinels not ready within 30s\n%s", st.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitInfo waits until INFO section of s contains want (bounded: 30 s).
func (st *Sentinel) waitInfo(s *Server, section, want string) {
	st.tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := s.secureCommand("INFO", section)
		if err == nil && strings.Contains(info, want) {
			return
		}
		if time.Now().After(deadline) {
			st.tb.Fatalf("redistest: %s: no %q in INFO %s within 30s (%v)\n%s", s.addr, want, section, err, s.LogTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fields reads a reply of alternating names and values, one per line.
func fields(out string) map[string]string {
	lines := strings.Split(out, "\n")
	m := make(map[string]string, len(lines)/2)
	for i := 0; i+1 < len(lines); i += 2 {
		m[lines[i]] = lines[i+1]
	}
	return m
}

func (st *Sentinel) logs() string {
	var b strings.Builder
	for _, s := range append(append([]*Server{}, st.Nodes...), st.Sentinels...) {
		b.WriteString(s.LogTail())
		b.WriteString("\n")
	}
	return b.String()
}

// Do sends one command to s (with AUTH first when s has a password, over
// TLS when it has TLS) and returns the reply as Command renders it.
func (s *Server) Do(args ...string) (string, error) {
	return s.secureCommand(args...)
}
